"""The structured-output view's server side: examples (JSON schemas, regexes, choice
lists) and the check of an answer against its schema (the python-jsonschema library,
Draft 2020-12, with its format checker: a "date" must be a real date), its regex or its
choices."""

from __future__ import annotations

import json
import re

from vllm_x86.tools.playground.models import PlaygroundError

SCHEMAS: list[dict] = [
    {
        "name": "person (nested object)",
        "schema": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1},
                "age": {"type": "integer", "minimum": 0, "maximum": 150},
                "address": {
                    "type": "object",
                    "properties": {
                        "city": {"type": "string"},
                        "country": {"type": "string"},
                    },
                    "required": ["city", "country"],
                    "additionalProperties": False,
                },
            },
            "required": ["name", "age", "address"],
            "additionalProperties": False,
        },
    },
    {
        "name": "event with a date (format: date)",
        "schema": {
            "type": "object",
            "properties": {
                "title": {"type": "string"},
                "date": {"type": "string", "format": "date"},
            },
            "required": ["title", "date"],
            "additionalProperties": False,
        },
    },
    {
        "name": "sentiment (enum)",
        "schema": {
            "type": "object",
            "properties": {
                "sentiment": {"enum": ["positive", "neutral", "negative"]},
                "confidence": {"type": "number", "minimum": 0, "maximum": 1},
            },
            "required": ["sentiment", "confidence"],
            "additionalProperties": False,
        },
    },
    {
        "name": "shopping list (array, 1 to 5 items)",
        "schema": {
            "type": "object",
            "properties": {
                "items": {
                    "type": "array",
                    "items": {"type": "string", "minLength": 1},
                    "minItems": 1,
                    "maxItems": 5,
                }
            },
            "required": ["items"],
            "additionalProperties": False,
        },
    },
    {
        "name": "recipe (array of objects)",
        "schema": {
            "type": "object",
            "properties": {
                "dish": {"type": "string"},
                "ingredients": {
                    "type": "array",
                    "minItems": 2,
                    "maxItems": 8,
                    "items": {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string"},
                            "grams": {"type": "integer", "minimum": 1},
                        },
                        "required": ["name", "grams"],
                        "additionalProperties": False,
                    },
                },
            },
            "required": ["dish", "ingredients"],
            "additionalProperties": False,
        },
    },
    {
        "name": "yes or no with a reason",
        "schema": {
            "type": "object",
            "properties": {"answer": {"type": "boolean"}, "reason": {"type": "string"}},
            "required": ["answer", "reason"],
            "additionalProperties": False,
        },
    },
    {
        "name": "country facts (bounded numbers)",
        "schema": {
            "type": "object",
            "properties": {
                "country": {"type": "string"},
                "capital": {"type": "string"},
                "population_millions": {"type": "number", "exclusiveMinimum": 0},
                "continent": {
                    "enum": [
                        "Africa",
                        "Asia",
                        "Europe",
                        "North America",
                        "Oceania",
                        "South America",
                        "Antarctica",
                    ]  # fmt: skip
                },
            },
            "required": ["country", "capital", "continent"],
            "additionalProperties": False,
        },
    },
    {
        "name": "contact (email format, optional phone)",
        "schema": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "email": {"type": "string", "format": "email"},
                "phone": {"type": "string", "pattern": "^[0-9+ -]{6,20}$"},
            },
            "required": ["name", "email"],
            "additionalProperties": False,
        },
    },
    {
        "name": "point (array with exactly 2 numbers)",
        "schema": {
            "type": "object",
            "properties": {
                "label": {"type": "string"},
                "xy": {
                    "type": "array",
                    "prefixItems": [{"type": "number"}, {"type": "number"}],
                    "items": False,
                    "minItems": 2,
                },
            },
            "required": ["label", "xy"],
            "additionalProperties": False,
        },
    },
    {
        "name": "task list (nested arrays and enums)",
        "schema": {
            "type": "object",
            "properties": {
                "project": {"type": "string"},
                "tasks": {
                    "type": "array",
                    "maxItems": 4,
                    "items": {
                        "type": "object",
                        "properties": {
                            "title": {"type": "string"},
                            "priority": {"enum": ["low", "medium", "high"]},
                            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
                        },
                        "required": ["title", "priority"],
                        "additionalProperties": False,
                    },
                },
            },
            "required": ["project", "tasks"],
            "additionalProperties": False,
        },
    },
    {
        "name": "meeting (date and time formats)",
        "schema": {
            "type": "object",
            "properties": {
                "topic": {"type": "string"},
                "day": {"type": "string", "format": "date"},
                "starts": {"type": "string", "pattern": "^([01][0-9]|2[0-3]):[0-5][0-9]$"},
                "minutes": {"type": "integer", "minimum": 5, "maximum": 480},
            },
            "required": ["topic", "day", "starts", "minutes"],
            "additionalProperties": False,
        },
    },
    {
        "name": "classification (integer label 1-5)",
        "schema": {
            "type": "object",
            "properties": {
                "text": {"type": "string"},
                "stars": {"type": "integer", "minimum": 1, "maximum": 5},
            },
            "required": ["stars"],
            "additionalProperties": False,
        },
    },
]

REGEXES: list[dict] = [
    {"name": "ISO date", "pattern": r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])"},
    {"name": "US phone number", "pattern": r"\(\d{3}\) \d{3}-\d{4}"},
    {
        "name": "IPv4 address",
        "pattern": r"((25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(25[0-5]|2[0-4]\d|1?\d?\d)",
    },
    {"name": "hex colour", "pattern": r"#[0-9a-fA-F]{6}"},
    {"name": "yes/no answer", "pattern": r"(Yes|No), because [a-z ,]{5,60}\."},
]

CHOICES: list[dict] = [
    {"name": "sentiment", "choices": ["positive", "neutral", "negative"]},
    {"name": "yes / no", "choices": ["yes", "no"]},
    {"name": "language", "choices": ["Python", "Rust", "C++", "Go", "JavaScript"]},
    {"name": "colour", "choices": ["red", "green", "blue", "yellow"]},
]


def examples() -> dict:
    return {"schemas": SCHEMAS, "regex": REGEXES, "choice": CHOICES}


def _where(err) -> str:
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path)
    return f"${path}" if path else "$"


def validate(body: dict) -> dict:
    """{"json_ok", "schema_ok", "errors"} for {"schema", "text"}; also {"regex", "text"}
    (the whole text must match) and {"choice": [...], "text"} (one of the choices)."""
    if not isinstance(body, dict):
        raise PlaygroundError(400, "the request body must be a JSON object")
    text = body.get("text")
    if not isinstance(text, str):
        raise PlaygroundError(400, "'text' (the model's answer) must be a string")
    if "regex" in body:
        pattern = body["regex"]
        if not isinstance(pattern, str):
            raise PlaygroundError(400, "'regex' must be a string")
        try:
            ok = re.fullmatch(pattern, text) is not None
        except re.error as e:
            raise PlaygroundError(400, f"the regex does not compile: {e}") from None
        errors = [] if ok else [f"the text does not match the regex {pattern}"]
        return {"json_ok": None, "schema_ok": ok, "errors": errors}
    if "choice" in body:
        choices = body["choice"]
        if not isinstance(choices, list) or not all(isinstance(c, str) for c in choices):
            raise PlaygroundError(400, "'choice' must be a list of strings")
        ok = text in choices
        errors = [] if ok else [f"the text is not one of the choices ({', '.join(choices)})"]
        return {"json_ok": None, "schema_ok": ok, "errors": errors}
    schema = body.get("schema")
    if not isinstance(schema, dict | bool):
        raise PlaygroundError(400, "'schema' must be a JSON Schema (an object)")
    import jsonschema
    from jsonschema import Draft202012Validator

    try:
        Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as e:
        raise PlaygroundError(
            400, f"the schema is not a valid JSON Schema (Draft 2020-12): {e.message}"
        ) from None
    try:
        doc = json.loads(text)
    except ValueError as e:
        return {"json_ok": False, "schema_ok": False, "errors": [f"the text is not JSON: {e}"]}
    v = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
    errs = sorted(v.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))
    return {
        "json_ok": True,
        "schema_ok": not errs,
        "errors": [f"{_where(e)}: {e.message}" for e in errs],
    }
