"""Which JSON Schema keywords the compiler reads, ignores, or refuses.

Every keyword the compiler knows is compiled exactly or refused with ConstraintError naming it
and its path. Annotation keywords never change which instances are valid, and neither do
unknown ones: JSON Schema says an implementation must ignore keywords it does not know
(vendor extensions such as ``x-kubernetes-*``, draft-04's ``id``, typos), so they are ignored,
with a debug-level log line. Draft-03's own keywords (``extends``, ``disallow``,
``divisibleBy``) are read in draft-03 documents (``drafts``) and unknown in the others.
"""

ANNOTATIONS = frozenset(
    {
        "$schema",
        "$id",
        "$anchor",
        "$dynamicAnchor",
        "$recursiveAnchor",
        "$comment",
        "$vocabulary",
        "$defs",
        "definitions",
        "title",
        "description",
        "default",
        "examples",
        "example",
        "deprecated",
        "readOnly",
        "writeOnly",
        "contentMediaType",
        "contentEncoding",
        "contentSchema",
        "discriminator",  # OpenAPI/pydantic: names the tag of a oneOf; validity comes from the oneOf
    }
)

NUMBER = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})
STRING = frozenset({"minLength", "maxLength", "pattern", "format"})
ARRAY = frozenset(
    {
        "prefixItems",
        "items",
        "additionalItems",
        "minItems",
        "maxItems",
        "uniqueItems",
        "contains",
        "minContains",
        "maxContains",
    }
)
OBJECT = frozenset(
    {
        "properties",
        "patternProperties",
        "additionalProperties",
        "required",
        "propertyNames",
        "minProperties",
        "maxProperties",
    }
)
APPLICATORS = frozenset(
    {
        "type",
        "enum",
        "const",
        "allOf",
        "anyOf",
        "oneOf",
        "not",
        "if",
        "then",
        "else",
        "$ref",
        "$dynamicRef",
        "$recursiveRef",
        "dependentRequired",
        "dependentSchemas",
        "dependencies",
        "unevaluatedProperties",
        "unevaluatedItems",
    }
)

KNOWN = ANNOTATIONS | NUMBER | STRING | ARRAY | OBJECT | APPLICATORS
