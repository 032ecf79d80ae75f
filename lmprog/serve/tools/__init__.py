"""Tool calls: the constraint a request's tools put on its text in the model family's call
format (formats.py, xml_calls.py, pythonic_calls.py), and reading the calls back (plan.py)."""
