"""Tool calls: the constraint a request's tools put on its text, in the model family's call
format, and the calls read back.

plan.py plans a request's tools; formats.py, xml_calls.py and pythonic_calls.py are the
layouts. Design: docs/design/server.md#tool-calls.
"""
