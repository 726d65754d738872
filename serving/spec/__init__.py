"""The typed fleet spec: the pydantic schema (``schema/``, also read from Hugging Face config.json) and stack
loading with errors that name the field, the value and the fix (``stack.py``)."""
