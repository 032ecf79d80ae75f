"""The term algebra: nodes of typed terms, their meet/complement, values, formats, strictness
and which string lengths the check counts apart."""
