"""Section 11 of bench/schema_corpus.py: configuration files as JSON Schema Store describes them.

Written for this repository in the shapes those schemas take (not copies): CI pipelines with
job maps under patternProperties, steps that are a string or an object with exactly one key,
notification settings as a oneOf of closed objects (which needs the complement of each), editor
and compiler options with long enums and lists of unique enum values, draft-04/07 metaschema-
like recursion (`$ref: "#"`), OpenAPI-like documents whose schema objects recurse, GeoJSON-like
tagged unions, expression trees, "at least one of" objects (minProperties beside optional
properties), and `$ref` next to sibling keywords. Entries are (name, kind, schema, valid,
invalid); the instances list object keys in the schema's property order.
"""

from __future__ import annotations

import copy
from typing import Any

S = {"type": "string"}
INT = {"type": "integer"}
N = {"type": "number"}
B = {"type": "boolean"}
STORE: list[tuple[str, str, Any, list, list]] = []


def add(name: str, schema: Any, valid: list, invalid: list) -> None:
    STORE.append((name, "store", schema, valid, invalid))


def setp(value: Any, path: str, new: Any) -> Any:
    """A copy of `value` with the member at a dotted path (list indices as numbers) replaced."""
    out = copy.deepcopy(value)
    *head, last = [int(p) if p.isdigit() else p for p in path.split(".")]
    node = out
    for p in head:
        node = node[p]
    node[last] = new
    return out


def drop(value: Any, path: str) -> Any:
    """A copy of `value` without the member at a dotted path."""
    out = copy.deepcopy(value)
    *head, last = [int(p) if p.isdigit() else p for p in path.split(".")]
    node = out
    for p in head:
        node = node[p]
    del node[last]
    return out


def extra(value: Any, path: str, key: str, new: Any) -> Any:
    """A copy with one more member `key` in the object at `path` ("" = the top)."""
    out = copy.deepcopy(value)
    node = out
    for p in [int(p) if p.isdigit() else p for p in path.split(".") if p]:
        node = node[p]
    node[key] = new
    return out


# ---- a CI workflow (GitHub-Actions-like) -------------------------------------------------------
EXPR = {"type": "string", "pattern": r"^\$\{\{(.|[\r\n])*\}\}$"}
STEP = {
    "type": "object",
    "properties": {
        "id": S,
        "name": S,
        "if": {"type": ["boolean", "number", "string"]},
        "uses": S,
        "run": S,
        "with": {
            "type": "object",
            "additionalProperties": {"type": ["string", "number", "boolean"]},
        },
        "env": {"$ref": "#/definitions/env"},
        "continue-on-error": {"oneOf": [B, EXPR]},
        "timeout-minutes": {"type": "number", "minimum": 0},
    },
    "oneOf": [{"required": ["uses"]}, {"required": ["run"]}],
    "additionalProperties": False,
}
WORKFLOW = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "definitions": {
        "env": {
            "oneOf": [
                {
                    "type": "object",
                    "additionalProperties": {"type": ["string", "number", "boolean"]},
                },
                EXPR,
            ]
        },
        "event": {"enum": ["push", "pull_request", "release", "schedule", "workflow_dispatch"]},
        "step": STEP,
        "defaults": {
            "type": "object",
            "properties": {
                "run": {
                    "type": "object",
                    "properties": {"shell": S, "working-directory": S},
                    "minProperties": 1,
                    "additionalProperties": False,
                }
            },
            "minProperties": 1,
            "additionalProperties": False,
        },
        "job": {
            "type": "object",
            "properties": {
                "name": S,
                "needs": {"oneOf": [S, {"type": "array", "items": S, "minItems": 1}]},
                "runs-on": {"oneOf": [S, {"type": "array", "items": S, "minItems": 1}]},
                "defaults": {"$ref": "#/definitions/defaults"},
                "env": {"$ref": "#/definitions/env"},
                "timeout-minutes": {"type": "number"},
                "strategy": {
                    "type": "object",
                    "properties": {
                        "matrix": {
                            "type": "object",
                            "patternProperties": {
                                "^(in|ex)clude$": {"type": "array", "items": {"type": "object"}}
                            },
                            "additionalProperties": {"type": "array", "minItems": 1},
                            "minProperties": 1,
                        },
                        "fail-fast": B,
                        "max-parallel": {"type": "integer", "minimum": 1},
                    },
                    "required": ["matrix"],
                    "additionalProperties": False,
                },
                "steps": {"type": "array", "items": {"$ref": "#/definitions/step"}, "minItems": 1},
            },
            "required": ["runs-on"],
            "additionalProperties": False,
        },
    },
    "type": "object",
    "properties": {
        "name": S,
        "on": {
            "oneOf": [
                {"$ref": "#/definitions/event"},
                {"type": "array", "items": {"$ref": "#/definitions/event"}, "minItems": 1},
                {"type": "object", "propertyNames": {"$ref": "#/definitions/event"}},
            ]
        },
        "env": {"$ref": "#/definitions/env"},
        "defaults": {"$ref": "#/definitions/defaults"},
        "jobs": {
            "type": "object",
            "patternProperties": {"^[_a-zA-Z][a-zA-Z0-9_-]*$": {"$ref": "#/definitions/job"}},
            "minProperties": 1,
            "additionalProperties": False,
        },
    },
    "required": ["on", "jobs"],
    "additionalProperties": False,
}
WF_OK = {
    "name": "ci",
    "on": ["push", "pull_request"],
    "env": {"CI": True, "LEVEL": 2},
    "jobs": {
        "test": {
            "runs-on": ["ubuntu-latest", "self-hosted"],
            "defaults": {"run": {"shell": "bash"}},
            "strategy": {"matrix": {"python": ["3.11", "3.12"], "include": [{"python": "3.13"}]}},
            "steps": [
                {"uses": "actions/checkout@v4"},
                {"name": "tests", "run": "pytest -q", "continue-on-error": "${{ matrix.flaky }}"},
            ],
        },
        "lint": {"needs": "test", "runs-on": "ubuntu-latest", "steps": [{"run": "ruff ."}]},
    },
}
add(
    "store/ci-workflow",
    WORKFLOW,
    [WF_OK, {"on": {"push": {"branches": ["main"]}}, "jobs": {"a": {"runs-on": "x"}}}],
    [
        setp(WF_OK, "on", ["push", "fork"]),
        setp(WF_OK, "jobs.test.steps.0", {"uses": "a", "run": "b"}),  # both: not oneOf
        setp(WF_OK, "jobs.test.steps.1", {"name": "nothing"}),  # neither
        setp(WF_OK, "jobs.test.defaults", {}),  # minProperties 1
        setp(WF_OK, "jobs.test.defaults", {"run": {}}),
        setp(WF_OK, "jobs", {}),
        setp(WF_OK, "jobs.lint.needs", []),
        setp(WF_OK, "jobs.test.strategy.matrix", {"python": []}),
        setp(WF_OK, "env", "CI=1"),
        {"on": {"fork": {}}, "jobs": {"a": {"runs-on": "x"}}},
        {"on": "push", "jobs": {"9bad": {"runs-on": "x"}}},
    ],
)

# ---- notifications: a oneOf of closed objects --------------------------------------------------
COND = {"type": "string", "minLength": 1}
NOTIFY = {
    "definitions": {
        "simple": {"type": "string", "enum": ["github_check", "github_commit_status"]},
        "email": {
            "type": "object",
            "properties": {"email": S, "if": COND},
            "additionalProperties": False,
        },
        "slack": {
            "type": "object",
            "properties": {
                "slack": {
                    "oneOf": [
                        {"type": "string", "pattern": r"^[^ \t\n\v\f\r]+$"},
                        {
                            "type": "object",
                            "properties": {"channels": {"type": "array", "items": S}, "message": S},
                            "additionalProperties": False,
                        },
                    ]
                },
                "if": COND,
            },
            "additionalProperties": False,
        },
        "webhook": {
            "type": "object",
            "properties": {"webhook": {"type": "string", "format": "uri"}, "if": COND},
            "additionalProperties": False,
        },
    },
    "type": "array",
    "items": {
        "oneOf": [
            {"$ref": "#/definitions/simple"},
            {"$ref": "#/definitions/email"},
            {"$ref": "#/definitions/slack"},
            {"$ref": "#/definitions/webhook"},
        ]
    },
}
add(
    "store/notify-oneof-closed",
    NOTIFY,
    [
        ["github_check", {"email": "a@b.c"}, {"slack": "#ops", "if": "failed"}],
        [{"slack": {"channels": ["#a"], "message": "hi"}}, {"webhook": "https://x.io/h"}],
        [],
    ],
    [
        [{}],  # matches every object branch
        [{"if": "x"}],
        [{"email": "a@b.c", "webhook": "https://x"}],  # no branch has both
        [{"slack": "has space"}],
        ["github"],
        [{"pager": "x"}],
    ],
)

# ---- CircleCI-like steps: a name, or an object with exactly one key ----------------------------
RUN = {
    "oneOf": [
        S,
        {
            "type": "object",
            "properties": {"command": S, "name": S, "background": B},
            "required": ["command"],
            "additionalProperties": False,
        },
    ]
}
STEPS = {
    "type": "object",
    "properties": {
        "steps": {
            "type": "array",
            "items": {
                "oneOf": [
                    {"enum": ["checkout", "setup_remote_docker", "add_ssh_keys"]},
                    {
                        "type": "object",
                        "properties": {
                            "run": RUN,
                            "save_cache": {"type": "object"},
                            "when": {"type": "object"},
                        },
                        "minProperties": 1,
                        "maxProperties": 1,
                    },
                ]
            },
        }
    },
    "required": ["steps"],
}
add(
    "store/steps-one-key",
    STEPS,
    [
        {
            "steps": [
                "checkout",
                {"run": "make"},
                {"run": {"command": "make test", "background": False}},
            ]
        },
        {"steps": [{"orb/job": {"x": 1}}, {"when": {"condition": True}}]},
    ],
    [
        {"steps": [{}]},
        {"steps": [{"run": "a", "save_cache": {}}]},
        {"steps": [{"run": {"name": "no command"}}]},
        {"steps": ["chekout"]},
        {"steps": [{"a": 1, "b": 2}]},
    ],
)

# ---- a compiler's options: long enums, unique lists of enum values, path maps ------------------
TARGETS = ["ES3", "ES5", "ES6", "ES2015", "ES2016", "ES2017", "ES2018", "ES2019", "ES2020"]
TARGETS += ["ES2021", "ES2022", "ES2023", "ESNext"]
LIBS = ["DOM", "DOM.Iterable", "WebWorker", "ScriptHost", "ES5", "ES2015", "ES2016", "ES2017"]
LIBS += ["ES2018", "ES2019", "ES2020", "ES2021", "ES2022", "ESNext", "ESNext.Array"]
COMPILER = {
    "type": "object",
    "properties": {
        "extends": {"oneOf": [S, {"type": "array", "items": S}]},
        "compilerOptions": {
            "type": "object",
            "properties": {
                "target": {"enum": TARGETS + [t.lower() for t in TARGETS]},
                "module": {
                    "enum": [
                        "commonjs",
                        "amd",
                        "umd",
                        "system",
                        "es2015",
                        "es2020",
                        "esnext",
                        "node16",
                        "nodenext",
                    ]
                },
                "lib": {"type": "array", "items": {"enum": LIBS}, "uniqueItems": True},
                "strict": B,
                "outDir": S,
                "baseUrl": S,
                "paths": {
                    "type": "object",
                    "additionalProperties": {"type": "array", "items": S, "minItems": 1},
                },
                "jsx": {"enum": ["preserve", "react", "react-jsx", "react-native"]},
                "maxNodeModuleJsDepth": {"type": "integer", "minimum": 0},
            },
        },
        "include": {"type": "array", "items": S},
        "exclude": {"type": "array", "items": S},
        "references": {
            "type": "array",
            "items": {"type": "object", "properties": {"path": S}, "required": ["path"]},
        },
    },
}
TS_OK = {
    "extends": "./base.json",
    "compilerOptions": {
        "target": "ES2022",
        "module": "esnext",
        "lib": ["DOM", "ES2022", "DOM.Iterable"],
        "strict": True,
        "paths": {"@app/*": ["src/*"], "*": ["types/*", "node_modules/*"]},
        "jsx": "react-jsx",
    },
    "include": ["src"],
    "references": [{"path": "../core"}],
}
add(
    "store/compiler-options",
    COMPILER,
    [TS_OK, {"compilerOptions": {"target": "esnext", "lib": []}}],
    [
        setp(TS_OK, "compilerOptions.lib", ["DOM", "ES2022", "DOM"]),
        setp(TS_OK, "compilerOptions.lib", ["DOM", "ES2024"]),
        setp(TS_OK, "compilerOptions.target", "es2024"),
        setp(TS_OK, "compilerOptions.paths", {"@app/*": []}),
        setp(TS_OK, "references", [{"name": "core"}]),
        setp(TS_OK, "compilerOptions.maxNodeModuleJsDepth", -1),
    ],
)

# ---- a linter's rules: a severity, or [severity, options...] (draft-04 items/additionalItems) ---
SEVERITY = {"oneOf": [{"enum": [0, 1, 2]}, {"enum": ["off", "warn", "error"]}]}
LINT = {
    "$schema": "http://json-schema.org/draft-04/schema#",
    "id": "https://example.org/linter.json",
    "definitions": {
        "rule": {
            "oneOf": [
                {"$ref": "#/definitions/severity"},
                {
                    "type": "array",
                    "items": [{"$ref": "#/definitions/severity"}],
                    "additionalItems": True,
                    "minItems": 1,
                },
            ]
        },
        "severity": SEVERITY,
    },
    "type": "object",
    "properties": {
        "root": B,
        "env": {"type": "object", "additionalProperties": B},
        "extends": {"oneOf": [S, {"type": "array", "items": S}]},
        "rules": {"type": "object", "additionalProperties": {"$ref": "#/definitions/rule"}},
        "overrides": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "files": {"type": "array", "items": S, "minItems": 1},
                    "rules": {"$ref": "#/properties/rules"},
                },
                "required": ["files"],
                "additionalProperties": False,
            },
        },
    },
}
LINT_OK = {
    "root": True,
    "env": {"browser": True, "node": False},
    "extends": ["eslint:recommended"],
    "rules": {
        "semi": ["error", "always"],
        "quotes": [2, "single", {"avoidEscape": True}],
        "no-undef": "warn",
    },
    "overrides": [{"files": ["*.test.js"], "rules": {"no-undef": 0}}],
}
add(
    "store/linter-rules",
    LINT,
    [LINT_OK, {"rules": {"eqeqeq": ["off"]}}],
    [
        setp(LINT_OK, "rules.semi", ["fatal", "always"]),
        setp(LINT_OK, "rules.semi", []),
        setp(LINT_OK, "rules.quotes", 3),
        setp(LINT_OK, "env.browser", "yes"),
        setp(LINT_OK, "overrides.0", {"files": [], "rules": {}}),
        setp(LINT_OK, "overrides.0", {"files": ["a"], "extra": 1}),
    ],
)

# ---- a JSON-Schema-like metaschema: recursion through "#", unique lists of type names ----------
TYPES = ["array", "boolean", "integer", "null", "number", "object", "string"]
META = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "definitions": {
        "schemaArray": {"type": "array", "minItems": 1, "items": {"$ref": "#"}},
        "simpleTypes": {"enum": TYPES},
        "nonNegativeInteger": {"type": "integer", "minimum": 0},
    },
    "type": ["object", "boolean"],
    "properties": {
        "title": S,
        "description": S,
        "type": {
            "anyOf": [
                {"$ref": "#/definitions/simpleTypes"},
                {
                    "type": "array",
                    "items": {"$ref": "#/definitions/simpleTypes"},
                    "minItems": 1,
                    "uniqueItems": True,
                },
            ]
        },
        "properties": {"type": "object", "additionalProperties": {"$ref": "#"}},
        "items": {"anyOf": [{"$ref": "#"}, {"$ref": "#/definitions/schemaArray"}]},
        "required": {"type": "array", "items": S},
        "anyOf": {"$ref": "#/definitions/schemaArray"},
        "minItems": {"$ref": "#/definitions/nonNegativeInteger"},
        "additionalProperties": {"$ref": "#"},
        "not": {"$ref": "#"},
    },
}
META_OK = {
    "title": "person",
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "tags": {"type": "array", "items": {"type": ["string", "null"]}, "minItems": 0},
        "parent": {
            "anyOf": [{"type": "null"}, {"properties": {"x": {"not": {"type": "integer"}}}}]
        },
    },
    "required": ["name"],
    "additionalProperties": False,
}
add(
    "store/metaschema-like",
    META,
    [META_OK, True, {"items": [{"items": {"items": {"type": "number"}}}, False]}],
    [
        setp(META_OK, "type", "struct"),
        setp(META_OK, "properties.tags.items.type", ["string", "string"]),
        setp(META_OK, "properties.tags.minItems", -1),
        setp(META_OK, "properties.parent.anyOf", []),
        setp(META_OK, "properties.parent.anyOf.1.properties.x.not", 7),
        setp(META_OK, "required", "name"),
        "schema",
    ],
)

# ---- an OpenAPI-like document: schema objects recurse through properties and items ------------
OPENAPI = {
    "type": "object",
    "definitions": {
        "schema": {
            "type": "object",
            "properties": {
                "type": {"enum": ["object", "array", "string", "integer", "number", "boolean"]},
                "properties": {
                    "type": "object",
                    "additionalProperties": {"$ref": "#/definitions/schema"},
                },
                "items": {"$ref": "#/definitions/schema"},
                "nullable": B,
                "enum": {"type": "array", "minItems": 1},
                "$ref": {"type": "string", "pattern": "^#/components/schemas/"},
            },
            "additionalProperties": False,
        },
        "parameter": {
            "type": "object",
            "properties": {
                "name": S,
                "in": {"enum": ["query", "header", "path", "cookie"]},
                "required": B,
                "schema": {"$ref": "#/definitions/schema"},
            },
            "required": ["name", "in"],
            "additionalProperties": False,
        },
        "operation": {
            "type": "object",
            "properties": {
                "operationId": S,
                "parameters": {"type": "array", "items": {"$ref": "#/definitions/parameter"}},
                "responses": {
                    "type": "object",
                    "patternProperties": {
                        "^[1-5][0-9]{2}$": {
                            "type": "object",
                            "properties": {"description": S},
                            "required": ["description"],
                        },
                        "^default$": {"type": "object"},
                    },
                    "minProperties": 1,
                    "additionalProperties": False,
                },
            },
            "required": ["responses"],
        },
    },
    "properties": {
        "openapi": {"type": "string", "pattern": r"^3\.[01]\.[0-9]+$"},
        "info": {
            "type": "object",
            "properties": {"title": S, "version": S},
            "required": ["title", "version"],
        },
        "paths": {
            "type": "object",
            "patternProperties": {
                "^/": {
                    "type": "object",
                    "properties": {
                        m: {"$ref": "#/definitions/operation"}
                        for m in ("get", "put", "post", "delete")
                    },
                    "additionalProperties": False,
                }
            },
            "additionalProperties": False,
        },
        "components": {
            "type": "object",
            "properties": {
                "schemas": {
                    "type": "object",
                    "additionalProperties": {"$ref": "#/definitions/schema"},
                }
            },
        },
    },
    "required": ["openapi", "info", "paths"],
}
API_OK = {
    "openapi": "3.0.3",
    "info": {"title": "Pets", "version": "1.0"},
    "paths": {
        "/pets": {
            "get": {
                "operationId": "listPets",
                "parameters": [{"name": "limit", "in": "query", "schema": {"type": "integer"}}],
                "responses": {"200": {"description": "ok"}, "default": {}},
            }
        }
    },
    "components": {
        "schemas": {
            "Pet": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "owner": {
                        "type": "object",
                        "properties": {
                            "pets": {"type": "array", "items": {"$ref": "#/components/schemas/Pet"}}
                        },
                    },
                },
            }
        }
    },
}
add(
    "store/openapi-like",
    OPENAPI,
    [API_OK],
    [
        setp(API_OK, "openapi", "2.0"),
        setp(API_OK, "paths./pets.get.responses", {}),
        setp(API_OK, "paths./pets.get.responses", {"600": {"description": "x"}}),
        setp(API_OK, "paths./pets.get.responses", {"200": {}}),
        setp(API_OK, "paths./pets.get.parameters.0.in", "body"),
        setp(
            API_OK, "components.schemas.Pet.properties.owner.properties.pets.items", {"$ref": "Pet"}
        ),
        setp(API_OK, "components.schemas.Pet.properties.owner.type", "map"),
        setp(API_OK, "paths", {"pets": {}}),
    ],
)

# ---- GeoJSON-like: a tagged union of geometries, nested coordinate arrays ----------------------
POS = {"type": "array", "items": N, "minItems": 2, "maxItems": 3}
GEO = {
    "definitions": {
        "point": {
            "type": "object",
            "properties": {"type": {"const": "Point"}, "coordinates": POS},
            "required": ["type", "coordinates"],
        },
        "line": {
            "type": "object",
            "properties": {
                "type": {"const": "LineString"},
                "coordinates": {"type": "array", "items": POS, "minItems": 2},
            },
            "required": ["type", "coordinates"],
        },
        "polygon": {
            "type": "object",
            "properties": {
                "type": {"const": "Polygon"},
                "coordinates": {
                    "type": "array",
                    "items": {"type": "array", "items": POS, "minItems": 4},
                },
            },
            "required": ["type", "coordinates"],
        },
        "geometry": {
            "oneOf": [
                {"$ref": "#/definitions/point"},
                {"$ref": "#/definitions/line"},
                {"$ref": "#/definitions/polygon"},
            ]
        },
    },
    "type": "object",
    "properties": {
        "type": {"const": "FeatureCollection"},
        "bbox": {"type": "array", "items": N, "minItems": 4},
        "features": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "type": {"const": "Feature"},
                    "geometry": {"oneOf": [{"type": "null"}, {"$ref": "#/definitions/geometry"}]},
                    "properties": {"oneOf": [{"type": "null"}, {"type": "object"}]},
                },
                "required": ["type", "geometry", "properties"],
            },
        },
    },
    "required": ["type", "features"],
}
GEO_OK = {
    "type": "FeatureCollection",
    "bbox": [-10.5, 40, 3.25, 52],
    "features": [
        {
            "type": "Feature",
            "geometry": {"type": "Point", "coordinates": [2.35, 48.85]},
            "properties": {"name": "Paris"},
        },
        {
            "type": "Feature",
            "geometry": {"type": "LineString", "coordinates": [[0, 0], [1, 1.5, 20]]},
            "properties": None,
        },
        {
            "type": "Feature",
            "geometry": {"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [1, 1], [0, 0]]]},
            "properties": {"area": {"value": 1, "unit": ["m", 2]}},
        },
        {"type": "Feature", "geometry": None, "properties": None},
    ],
}
add(
    "store/geojson-like",
    GEO,
    [GEO_OK],
    [
        setp(GEO_OK, "features.0.geometry.coordinates", [2.35]),
        setp(GEO_OK, "features.1.geometry.coordinates", [[0, 0]]),
        setp(GEO_OK, "features.2.geometry.coordinates", [[[0, 0], [1, 0], [0, 0]]]),
        setp(GEO_OK, "features.0.geometry.type", "Circle"),
        setp(GEO_OK, "bbox", [1, 2, 3]),
        drop(GEO_OK, "features.3.properties"),
        setp(GEO_OK, "type", "Feature"),
    ],
)

# ---- an expression tree: a tagged union that recurses ------------------------------------------
EXPR_TREE = {
    "$defs": {
        "expr": {
            "oneOf": [
                {
                    "type": "object",
                    "properties": {"op": {"const": "num"}, "value": N},
                    "required": ["op", "value"],
                    "additionalProperties": False,
                },
                {
                    "type": "object",
                    "properties": {
                        "op": {"const": "var"},
                        "name": {"type": "string", "pattern": "^[a-z_][a-z0-9_]*$"},
                    },
                    "required": ["op", "name"],
                    "additionalProperties": False,
                },
                {
                    "type": "object",
                    "properties": {
                        "op": {"enum": ["add", "mul", "sub"]},
                        "args": {"type": "array", "items": {"$ref": "#/$defs/expr"}, "minItems": 2},
                    },
                    "required": ["op", "args"],
                    "additionalProperties": False,
                },
                {
                    "type": "object",
                    "properties": {"op": {"const": "neg"}, "arg": {"$ref": "#/$defs/expr"}},
                    "required": ["op", "arg"],
                    "additionalProperties": False,
                },
            ]
        }
    },
    "$ref": "#/$defs/expr",
}
TREE_OK = {
    "op": "add",
    "args": [
        {"op": "num", "value": 1},
        {
            "op": "mul",
            "args": [
                {"op": "var", "name": "x"},
                {"op": "neg", "arg": {"op": "neg", "arg": {"op": "num", "value": 2.5}}},
            ],
        },
    ],
}
add(
    "store/expression-tree",
    EXPR_TREE,
    [TREE_OK, {"op": "var", "name": "y_1"}],
    [
        setp(TREE_OK, "args", [{"op": "num", "value": 1}]),
        setp(TREE_OK, "args.1.args.0.name", "X"),
        setp(TREE_OK, "args.1.args.1.arg.arg", {"op": "num"}),
        setp(TREE_OK, "op", "div"),
        setp(TREE_OK, "args.0", {"op": "num", "value": 1, "unit": "m"}),
    ],
)

# ---- a dependency-update config: long enums, schedules, closed items, unique enum lists --------
ECOSYSTEMS = ["bundler", "cargo", "composer", "docker", "elm", "gitsubmodule", "github-actions"]
ECOSYSTEMS += [
    "gomod",
    "gradle",
    "maven",
    "mix",
    "npm",
    "nuget",
    "pip",
    "pub",
    "swift",
    "terraform",
]
UPDATES = {
    "type": "object",
    "properties": {
        "version": {"const": 2},
        "updates": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "package-ecosystem": {"enum": ECOSYSTEMS},
                    "directory": {"type": "string", "pattern": "^/"},
                    "schedule": {
                        "type": "object",
                        "properties": {
                            "interval": {"enum": ["daily", "weekly", "monthly"]},
                            "day": {
                                "enum": [
                                    "monday",
                                    "tuesday",
                                    "wednesday",
                                    "thursday",
                                    "friday",
                                    "saturday",
                                    "sunday",
                                ]
                            },
                            "time": {
                                "type": "string",
                                "pattern": "^([01][0-9]|2[0-3]):[0-5][0-9]$",
                            },
                        },
                        "required": ["interval"],
                        "additionalProperties": False,
                    },
                    "labels": {
                        "type": "array",
                        "items": {"enum": ["dependencies", "security", "ci", "docs"]},
                        "uniqueItems": True,
                    },
                    "open-pull-requests-limit": {"type": "integer", "minimum": 0, "maximum": 100},
                    "allow": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "dependency-name": S,
                                "dependency-type": {"enum": ["direct", "indirect", "all"]},
                            },
                            "minProperties": 1,
                            "additionalProperties": False,
                        },
                    },
                },
                "required": ["package-ecosystem", "directory", "schedule"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["version", "updates"],
}
UP_OK = {
    "version": 2,
    "updates": [
        {
            "package-ecosystem": "pip",
            "directory": "/",
            "schedule": {"interval": "weekly", "day": "monday", "time": "04:30"},
            "labels": ["security", "dependencies"],
            "allow": [{"dependency-type": "direct"}, {"dependency-name": "requests"}],
        },
        {
            "package-ecosystem": "github-actions",
            "directory": "/.github",
            "schedule": {"interval": "daily"},
        },
    ],
}
add(
    "store/dependency-updates",
    UPDATES,
    [UP_OK],
    [
        setp(UP_OK, "updates.0.labels", ["ci", "ci"]),
        setp(UP_OK, "updates.0.allow.0", {}),
        setp(UP_OK, "updates.0.schedule.time", "24:00"),
        setp(UP_OK, "updates.0.package-ecosystem", "yarn"),
        setp(UP_OK, "updates.0.directory", "src"),
        setp(UP_OK, "version", 1),
        setp(UP_OK, "updates.1.schedule", {"interval": "hourly"}),
        setp(UP_OK, "updates.0.open-pull-requests-limit", 101),
    ],
)

# ---- a docs builder config: "at least one tool", oneOf install entries -------------------------
DOCS = {
    "type": "object",
    "properties": {
        "version": {"enum": [2, "2"]},
        "build": {
            "type": "object",
            "properties": {
                "os": {"enum": ["ubuntu-20.04", "ubuntu-22.04", "ubuntu-24.04"]},
                "tools": {
                    "type": "object",
                    "properties": {
                        "python": {
                            "enum": ["3.8", "3.9", "3.10", "3.11", "3.12", "miniconda3-4.7"]
                        },
                        "nodejs": {"enum": ["16", "18", "20"]},
                        "rust": {"enum": ["1.70", "1.75"]},
                    },
                    "minProperties": 1,
                    "additionalProperties": False,
                },
            },
            "required": ["os", "tools"],
            "additionalProperties": False,
        },
        "python": {
            "type": "object",
            "properties": {
                "install": {
                    "type": "array",
                    "items": {
                        "oneOf": [
                            {
                                "type": "object",
                                "properties": {"requirements": S},
                                "required": ["requirements"],
                                "additionalProperties": False,
                            },
                            {
                                "type": "object",
                                "properties": {
                                    "path": S,
                                    "method": {"enum": ["pip", "setuptools"]},
                                    "extra_requirements": {"type": "array", "items": S},
                                },
                                "required": ["path"],
                                "additionalProperties": False,
                            },
                        ]
                    },
                }
            },
            "additionalProperties": False,
        },
        "formats": {
            "oneOf": [
                {"const": "all"},
                {
                    "type": "array",
                    "items": {"enum": ["htmlzip", "pdf", "epub"]},
                    "uniqueItems": True,
                },
            ]
        },
    },
    "required": ["version"],
    "additionalProperties": False,
}
DOCS_OK = {
    "version": 2,
    "build": {"os": "ubuntu-22.04", "tools": {"python": "3.12", "nodejs": "20"}},
    "python": {
        "install": [
            {"requirements": "docs/requirements.txt"},
            {"path": ".", "method": "pip", "extra_requirements": ["docs"]},
        ]
    },
    "formats": ["pdf", "epub"],
}
add(
    "store/docs-build",
    DOCS,
    [DOCS_OK, {"version": "2", "formats": "all"}],
    [
        setp(DOCS_OK, "build.tools", {}),
        setp(DOCS_OK, "build.tools", {"go": "1.21"}),
        setp(DOCS_OK, "python.install.0", {"requirements": "r.txt", "path": "."}),
        setp(DOCS_OK, "python.install.1", {"method": "pip"}),
        setp(DOCS_OK, "formats", ["pdf", "pdf"]),
        setp(DOCS_OK, "formats", "none"),
        setp(DOCS_OK, "version", 3),
    ],
)

# ---- a container service map: patternProperties of services, ports in three shapes -------------
SERVICE = {
    "type": "object",
    "properties": {
        "image": S,
        "command": {"oneOf": [S, {"type": "array", "items": S}]},
        "ports": {
            "type": "array",
            "items": {
                "oneOf": [
                    {"type": "number"},
                    {"type": "string", "pattern": r"^[0-9]+(:[0-9]+)?(/(tcp|udp))?$"},
                    {
                        "type": "object",
                        "properties": {
                            "target": {"type": "integer"},
                            "published": {"type": ["string", "integer"]},
                            "protocol": {"enum": ["tcp", "udp"]},
                        },
                        "required": ["target"],
                        "additionalProperties": False,
                    },
                ]
            },
        },
        "environment": {
            "oneOf": [
                {
                    "type": "object",
                    "patternProperties": {".+": {"type": ["string", "number", "boolean", "null"]}},
                    "additionalProperties": False,
                },
                {"type": "array", "items": S},
            ]
        },
        "depends_on": {
            "type": "array",
            "items": {"type": "string", "pattern": "^[a-zA-Z0-9._-]+$"},
        },
        "restart": {"enum": ["no", "always", "on-failure", "unless-stopped"]},
        "healthcheck": {
            "type": "object",
            "properties": {
                "test": {"oneOf": [S, {"type": "array", "items": S}]},
                "interval": S,
                "retries": {"type": "number"},
            },
            "additionalProperties": False,
        },
    },
    "patternProperties": {"^x-": {}},
    "additionalProperties": False,
}
COMPOSE = {
    "type": "object",
    "properties": {
        "services": {
            "type": "object",
            "patternProperties": {"^[a-zA-Z0-9._-]+$": SERVICE},
            "additionalProperties": False,
        },
        "volumes": {
            "type": "object",
            "additionalProperties": {"oneOf": [{"type": "object"}, {"type": "null"}]},
        },
    },
    "patternProperties": {"^x-": {}},
    "additionalProperties": False,
}
COMPOSE_OK = {
    "services": {
        "web": {
            "image": "nginx:1.25",
            "ports": [80, "8443:443/tcp", {"target": 9000, "published": "9000", "protocol": "udp"}],
            "environment": {"MODE": "prod", "WORKERS": 4, "DEBUG": False, "TOKEN": None},
            "depends_on": ["db"],
            "restart": "always",
            "x-note": {"any": ["thing", 1]},
        },
        "db": {
            "image": "postgres",
            "environment": ["POSTGRES_PASSWORD=x"],
            "healthcheck": {"test": ["CMD", "pg_isready"], "retries": 5},
        },
    },
    "volumes": {"data": None, "logs": {"driver": "local"}},
    "x-shared": [1, 2],
}
add(
    "store/compose-like",
    COMPOSE,
    [COMPOSE_OK],
    [
        setp(COMPOSE_OK, "services.web.ports.1", "http"),
        setp(COMPOSE_OK, "services.web.ports.2", {"published": 80}),
        setp(COMPOSE_OK, "services.web.restart", "sometimes"),
        setp(COMPOSE_OK, "services.web.environment", {"A": [1]}),
        setp(COMPOSE_OK, "services.db.healthcheck", {"test": 1}),
        setp(COMPOSE_OK, "services.db.extra", 1),
        setp(COMPOSE_OK, "services", {"bad name": {}}),
        setp(COMPOSE_OK, "volumes", {"data": 1}),
        {"version": "3"},
    ],
)

# ---- a team directory: enums of many strings (countries, time zones), deep nesting -------------
COUNTRIES = ["AR", "AT", "AU", "BE", "BR", "CA", "CH", "CL", "CN", "CO", "CZ", "DE", "DK", "EG"]
COUNTRIES += ["ES", "FI", "FR", "GB", "GR", "HK", "HU", "ID", "IE", "IL", "IN", "IT", "JP", "KE"]
COUNTRIES += ["KR", "MX", "MY", "NG", "NL", "NO", "NZ", "PE", "PH", "PK", "PL", "PT", "RO", "SA"]
COUNTRIES += ["SE", "SG", "TH", "TR", "TW", "UA", "US", "VN", "ZA"]
ZONES = [
    f"{r}/{c}"
    for r, cs in (
        ("Europe", ["Paris", "Berlin", "Madrid", "Rome", "Oslo"]),
        ("America", ["New_York", "Chicago", "Denver", "Los_Angeles", "Sao_Paulo"]),
        ("Asia", ["Tokyo", "Seoul", "Shanghai", "Kolkata", "Dubai"]),
    )
    for c in cs
]
DIRECTORY = {
    "type": "object",
    "properties": {
        "org": {
            "type": "object",
            "properties": {
                "name": S,
                "divisions": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "name": S,
                            "teams": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "properties": {
                                        "name": S,
                                        "members": {
                                            "type": "array",
                                            "items": {
                                                "type": "object",
                                                "properties": {
                                                    "name": S,
                                                    "country": {"enum": COUNTRIES},
                                                    "tz": {"enum": ZONES},
                                                    "languages": {
                                                        "type": "array",
                                                        "items": {
                                                            "enum": [
                                                                "en",
                                                                "fr",
                                                                "de",
                                                                "es",
                                                                "ja",
                                                                "ko",
                                                                "zh",
                                                                "pt",
                                                            ]
                                                        },
                                                        "uniqueItems": True,
                                                        "maxItems": 4,
                                                    },
                                                },
                                                "required": ["name", "country"],
                                                "additionalProperties": False,
                                            },
                                        },
                                    },
                                    "required": ["name"],
                                },
                            },
                        },
                    },
                },
            },
            "required": ["name"],
        }
    },
    "required": ["org"],
}
DIR_OK = {
    "org": {
        "name": "Acme",
        "divisions": [
            {
                "name": "R&D",
                "teams": [
                    {
                        "name": "compilers",
                        "members": [
                            {
                                "name": "Ada",
                                "country": "GB",
                                "tz": "Europe/Paris",
                                "languages": ["en", "fr"],
                            },
                            {"name": "Kenji", "country": "JP"},
                        ],
                    },
                    {"name": "infra", "members": [], "oncall": {"week": 3}},
                ],
            }
        ],
    }
}
add(
    "store/team-directory",
    DIRECTORY,
    [DIR_OK],
    [
        setp(DIR_OK, "org.divisions.0.teams.0.members.0.country", "XX"),
        setp(DIR_OK, "org.divisions.0.teams.0.members.0.tz", "Mars/Olympus"),
        setp(DIR_OK, "org.divisions.0.teams.0.members.0.languages", ["en", "en"]),
        setp(DIR_OK, "org.divisions.0.teams.0.members.0.languages", ["en", "fr", "de", "es", "ja"]),
        drop(DIR_OK, "org.divisions.0.teams.1.name"),
        setp(
            DIR_OK, "org.divisions.0.teams.0.members.1", {"name": "K", "country": "JP", "role": "x"}
        ),
    ],
)

# ---- a settings file: $ref beside sibling keywords, if/then on a discriminator -----------------
SETTINGS = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "definitions": {
        "level": {"type": "string", "enum": ["debug", "info", "warning", "error"]},
        "handler": {
            "type": "object",
            "properties": {
                "kind": {"enum": ["file", "stream", "syslog"]},
                "level": {"$ref": "#/definitions/level"},
                "path": S,
                "address": S,
            },
            "required": ["kind"],
            "if": {"properties": {"kind": {"const": "file"}}},
            "then": {"required": ["path"]},
            "else": {"not": {"required": ["path"]}},
        },
    },
    "type": "object",
    "properties": {
        "level": {"$ref": "#/definitions/level", "default": "info", "description": "root level"},
        "handlers": {
            "type": "object",
            "additionalProperties": {"$ref": "#/definitions/handler"},
            "maxProperties": 8,
        },
        "quiet": {"$ref": "#/definitions/level", "enum": ["warning", "error"]},
    },
    "dependencies": {"quiet": ["handlers"]},
}
SET_OK = {
    "level": "debug",
    "handlers": {
        "main": {"kind": "file", "level": "info", "path": "/var/log/app.log"},
        "out": {"kind": "stream"},
    },
    "quiet": "error",
}
add(
    "store/settings-ref-siblings",
    SETTINGS,
    [SET_OK, {}, setp(SET_OK, "quiet", "info")],  # draft-07: $ref's siblings are ignored
    [
        setp(SET_OK, "quiet", "trace"),
        setp(SET_OK, "handlers.main", {"kind": "file"}),
        setp(SET_OK, "handlers.out", {"kind": "stream", "path": "x"}),
        setp(SET_OK, "level", "trace"),
        drop(SET_OK, "handlers"),
        setp(SET_OK, "handlers", {f"h{i}": {"kind": "stream"} for i in range(9)}),
    ],
)

# ---- a tool set as an agent framework declares it: tool calls as a tagged oneOf -----------------
CALLS = {
    "type": "object",
    "properties": {
        "thought": S,
        "calls": {
            "type": "array",
            "maxItems": 4,
            "items": {
                "oneOf": [
                    {
                        "type": "object",
                        "properties": {
                            "name": {"const": "search"},
                            "arguments": {
                                "type": "object",
                                "properties": {
                                    "query": {"type": "string", "minLength": 1},
                                    "top_k": {"type": "integer", "minimum": 1, "maximum": 20},
                                },
                                "required": ["query"],
                                "additionalProperties": False,
                            },
                        },
                        "required": ["name", "arguments"],
                        "additionalProperties": False,
                    },
                    {
                        "type": "object",
                        "properties": {
                            "name": {"const": "fetch"},
                            "arguments": {
                                "type": "object",
                                "properties": {
                                    "url": {"type": "string", "format": "uri"},
                                    "headers": {"type": "object", "additionalProperties": S},
                                },
                                "required": ["url"],
                            },
                        },
                        "required": ["name", "arguments"],
                        "additionalProperties": False,
                    },
                    {
                        "type": "object",
                        "properties": {
                            "name": {"const": "finish"},
                            "arguments": {
                                "type": "object",
                                "properties": {"answer": S},
                                "required": ["answer"],
                                "additionalProperties": False,
                            },
                        },
                        "required": ["name", "arguments"],
                        "additionalProperties": False,
                    },
                ]
            },
        },
    },
    "required": ["calls"],
    "additionalProperties": False,
}
CALLS_OK = {
    "thought": "look it up",
    "calls": [
        {"name": "search", "arguments": {"query": "json schema", "top_k": 3}},
        {
            "name": "fetch",
            "arguments": {
                "url": "https://json-schema.org",
                "headers": {"Accept": "text/html"},
                "timeout": 5,
            },
        },
        {"name": "finish", "arguments": {"answer": "done"}},
    ],
}
add(
    "store/agent-tool-calls",
    CALLS,
    [CALLS_OK, {"calls": []}],
    [
        setp(CALLS_OK, "calls.0.arguments.top_k", 21),
        setp(CALLS_OK, "calls.0.arguments", {"query": ""}),
        setp(CALLS_OK, "calls.2.arguments", {"answer": "x", "extra": 1}),
        setp(CALLS_OK, "calls.1.name", "browse"),
        setp(CALLS_OK, "calls.1.arguments.headers", {"Accept": 1}),
        setp(CALLS_OK, "calls", [CALLS_OK["calls"][0]] * 5),
    ],
)

# ---- a file tree: directories recurse, files are closed objects --------------------------------
TREE = {
    "$defs": {
        "file": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "pattern": "^[^/]+$"},
                "size": {"type": "integer", "minimum": 0},
            },
            "required": ["name", "size"],
            "additionalProperties": False,
        },
        "dir": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "pattern": "^[^/]+$"},
                "children": {
                    "type": "array",
                    "items": {"anyOf": [{"$ref": "#/$defs/file"}, {"$ref": "#/$defs/dir"}]},
                },
            },
            "required": ["name", "children"],
            "additionalProperties": False,
        },
    },
    "$ref": "#/$defs/dir",
}
FS_OK = {
    "name": "root",
    "children": [
        {"name": "a.txt", "size": 12},
        {
            "name": "src",
            "children": [
                {
                    "name": "lib",
                    "children": [{"name": "deep", "children": [{"name": "x.py", "size": 0}]}],
                }
            ],
        },
        {"name": "empty", "children": []},
    ],
}
add(
    "store/file-tree",
    TREE,
    [FS_OK],
    [
        setp(FS_OK, "children.0.size", -1),
        setp(FS_OK, "children.1.children.0.children.0.children.0.name", "a/b"),
        setp(FS_OK, "children.2", {"name": "empty"}),
        setp(FS_OK, "children.0", {"name": "a", "size": 1, "children": []}),
    ],
)
