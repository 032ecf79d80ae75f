"""Which JSON Schema keywords the compiler reads, ignores, or refuses.

Annotation-only keywords never change which instances are valid and are ignored. Every other
keyword is either compiled exactly or refused with ConstraintError naming it and its path, so an
unknown keyword can never silently widen a constraint.
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
        "dependentRequired",
        "dependentSchemas",
        "dependencies",
        "unevaluatedProperties",
        "unevaluatedItems",
    }
)

REFUSED = {
    "$dynamicRef": "dynamic references are not supported",
    "$recursiveRef": "recursive references (draft 2019-09) are not supported",
}

KNOWN = ANNOTATIONS | NUMBER | STRING | ARRAY | OBJECT | APPLICATORS
