"""Structured output helpers of the plugin that import nothing of vLLM (json_budget.py:
the shortest valid instance of a JSON schema, a partial-JSON parser that follows a
schema, the shortest completion of a partial answer, and token counts of both)."""
