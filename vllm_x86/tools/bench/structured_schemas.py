"""The schemas of the structured-output benchmark (structured.py), each with the prompt
that asks for it: (name, prompt, schema). Varied on purpose: nested objects, arrays with
bounds, enums, bounded numbers, optional fields, patterns, formats, unions, $ref,
additionalProperties, and long free-text fields that invite a small model to run on
inside a string until max_tokens."""

from __future__ import annotations

_S = {"type": "string"}
_I = {"type": "integer"}
_N = {"type": "number"}
_B = {"type": "boolean"}


def _obj(props: dict, required=None, **extra) -> dict:
    return {
        "type": "object",
        "properties": props,
        "required": list(props) if required is None else required,
        **extra,
    }


SCHEMAS: list[tuple[str, str, dict]] = [
    ("name_age", "Describe a person as JSON with name and age.", _obj({"name": _S, "age": _I})),
    ("city", "Give a city as JSON.", _obj({"city": _S, "country": _S, "population": _I})),
    ("flag", "Is the sky blue? Answer as JSON.", _obj({"answer": _B})),
    (
        "score",
        "Rate this movie as JSON.",
        _obj({"score": {"type": "number", "minimum": 0, "maximum": 10}}),
    ),
    (
        "int_range",
        "Pick a dice roll as JSON.",
        _obj({"roll": {"type": "integer", "minimum": 1, "maximum": 6}}),
    ),
    (
        "neg_bound",
        "Give a winter temperature as JSON.",
        _obj({"celsius": {"type": "integer", "minimum": -50, "maximum": -1}}),
    ),
    (
        "excl_bound",
        "Give a probability as JSON.",
        _obj({"p": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}}),
    ),
    ("enum_color", "Pick a color as JSON.", _obj({"color": {"enum": ["red", "green", "blue"]}})),
    ("enum_mixed", "Pick a level as JSON.", _obj({"level": {"enum": [1, 2, "max", None]}})),
    ("const", "Return the version as JSON.", _obj({"version": {"const": "v1"}, "ok": _B})),
    (
        "sentiment",
        "Classify 'I love it' as JSON with a label and a reason.",
        _obj({"label": {"enum": ["positive", "negative", "neutral"]}, "reason": _S}),
    ),
    (
        "optional",
        "Describe a book as JSON.",
        _obj({"title": _S, "subtitle": _S, "year": _I, "isbn": _S}, required=["title", "year"]),
    ),
    ("all_optional", "Describe a car as JSON.", _obj({"make": _S, "model": _S}, required=[])),
    (
        "nested",
        "Describe a company and its CEO as JSON.",
        _obj({"company": _S, "ceo": _obj({"name": _S, "age": _I})}),
    ),
    (
        "deep_nested",
        "Give a nested config as JSON.",
        _obj({"a": _obj({"b": _obj({"c": _obj({"d": _S})})})}),
    ),
    ("array_str", "List three fruits as JSON.", _obj({"fruits": {"type": "array", "items": _S}})),
    (
        "array_min",
        "List at least two colours as JSON.",
        _obj({"colours": {"type": "array", "items": _S, "minItems": 2}}),
    ),
    (
        "array_bounds",
        "List two to four numbers as JSON.",
        _obj({"numbers": {"type": "array", "items": _I, "minItems": 2, "maxItems": 4}}),
    ),
    (
        "array_objects",
        "List two people with names and ages as JSON.",
        _obj({"people": {"type": "array", "items": _obj({"name": _S, "age": _I}), "minItems": 1}}),
    ),
    (
        "tuple",
        "Give a point as JSON.",
        _obj({"point": {"type": "array", "prefixItems": [_N, _N], "minItems": 2, "items": False}}),
    ),
    (
        "root_array",
        "List some tags as a JSON array.",
        {"type": "array", "items": _S, "maxItems": 5},
    ),
    (
        "matrix",
        "Give a 2x2 matrix as JSON.",
        _obj(
            {
                "rows": {
                    "type": "array",
                    "items": {"type": "array", "items": _I, "minItems": 2, "maxItems": 2},
                    "minItems": 2,
                    "maxItems": 2,
                }
            }
        ),
    ),
    (
        "pattern_zip",
        "Give a US ZIP code as JSON.",
        _obj({"zip": {"type": "string", "pattern": "^[0-9]{5}$"}}),
    ),
    (
        "pattern_code",
        "Give a product code as JSON.",
        _obj({"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2,4}$"}}),
    ),
    (
        "pattern_phone",
        "Give a phone number as JSON.",
        _obj({"phone": {"type": "string", "pattern": "^\\+?[0-9]{7,12}$"}}),
    ),
    (
        "date",
        "When was the moon landing? Answer as JSON.",
        _obj({"date": {"type": "string", "format": "date"}}),
    ),
    (
        "date_time",
        "Give a meeting time as JSON.",
        _obj({"when": {"type": "string", "format": "date-time"}}),
    ),
    ("uuid", "Give an id as JSON.", _obj({"id": {"type": "string", "format": "uuid"}})),
    ("ipv4", "Give a server address as JSON.", _obj({"ip": {"type": "string", "format": "ipv4"}})),
    (
        "string_len",
        "Give a short nickname as JSON.",
        _obj({"nick": {"type": "string", "minLength": 3, "maxLength": 8}}),
    ),
    (
        "union_scalar",
        "Give an id that is a number or a string, as JSON.",
        _obj({"id": {"anyOf": [_I, _S]}}),
    ),
    (
        "union_type_list",
        "Give a value or null as JSON.",
        _obj({"value": {"type": ["number", "null"]}}),
    ),
    (
        "union_objects",
        "Describe a shape as JSON.",
        _obj(
            {
                "shape": {
                    "oneOf": [
                        _obj({"kind": {"const": "circle"}, "r": _N}),
                        _obj({"kind": {"const": "rect"}, "w": _N, "h": _N}),
                    ]
                }
            }
        ),
    ),
    (
        "ref_defs",
        "Give two addresses as JSON.",
        {
            "type": "object",
            "$defs": {"addr": _obj({"street": _S, "city": _S})},
            "properties": {"home": {"$ref": "#/$defs/addr"}, "work": {"$ref": "#/$defs/addr"}},
            "required": ["home", "work"],
        },
    ),
    (
        "additional_true",
        "Give some settings as JSON.",
        _obj({"name": _S}, additionalProperties=True),
    ),
    (
        "additional_schema",
        "Give word counts as JSON.",
        {"type": "object", "additionalProperties": _I},
    ),
    (
        "additional_false",
        "Describe a user as JSON.",
        _obj({"user": _S, "admin": _B}, additionalProperties=False),
    ),
    ("free_object", "Give any JSON object.", {"type": "object"}),
    (
        "long_story",
        "Write a long story about a dragon, as JSON with a title and the story.",
        _obj({"title": _S, "story": _S}),
    ),
    (
        "long_essay",
        "Write a detailed essay about the ocean as JSON.",
        _obj({"essay": _S, "word_count": _I}),
    ),
    (
        "long_list",
        "List as many animals as you can as JSON.",
        _obj({"animals": {"type": "array", "items": _S}}),
    ),
    (
        "long_nested_text",
        "Describe three chapters of a novel in detail as JSON.",
        _obj(
            {
                "book": _S,
                "chapters": {
                    "type": "array",
                    "items": _obj({"title": _S, "summary": _S}),
                    "minItems": 3,
                },
            }
        ),
    ),
    (
        "long_then_required",
        "Write a long review, then give a rating, as JSON.",
        _obj(
            {
                "review": _S,
                "rating": {"type": "integer", "minimum": 1, "maximum": 5},
                "tags": {"type": "array", "items": _S, "minItems": 1},
            }
        ),
    ),
    (
        "recipe",
        "Give a recipe as JSON.",
        _obj(
            {
                "name": _S,
                "servings": {"type": "integer", "minimum": 1},
                "ingredients": {
                    "type": "array",
                    "items": _obj({"item": _S, "grams": _N}),
                    "minItems": 1,
                },
                "steps": {"type": "array", "items": _S, "minItems": 1},
                "vegetarian": _B,
            },
            required=["name", "ingredients", "steps"],
        ),
    ),
    (
        "event",
        "Describe a conference as JSON.",
        _obj(
            {
                "name": _S,
                "date": {"type": "string", "format": "date"},
                "tracks": {
                    "type": "array",
                    "items": {"enum": ["ai", "web", "systems"]},
                    "minItems": 1,
                },
                "capacity": {"type": "integer", "minimum": 10, "maximum": 10000},
                "notes": _S,
            },
            required=["name", "date", "tracks", "capacity"],
        ),
    ),
    ("unicode", "Say hello in Japanese as JSON.", _obj({"greeting": _S, "language": _S})),
]
