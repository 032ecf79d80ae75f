"""A corpus of real-world-shaped JSON schemas for the constraint benchmarks (issue 14).

    from schema_corpus import CORPUS, check_corpus
    for entry in CORPUS: entry.name, entry.kind, entry.schema, entry.valid, entry.invalid

Written for this repository (shapes like those people use, not copies of anyone's schemas):
function-calling tool schemas, OpenAI-strict response formats, data records with nested
objects, enums, formats (date, date-time, time, email, uuid, uri, ipv4), patterns, bounded
arrays, `$defs`/`$ref`, `anyOf`/`oneOf`, open objects (additionalProperties unset), maps,
Kubernetes-like and package.json-like manifests, draft-04 spellings (`id`, `definitions`,
boolean `exclusiveMinimum`) and annotation keywords (`title`, `examples`, `x-*`, `readOnly`),
and JSON-Schema-Store-like configuration files (bench/schema_corpus_store.py).

Every entry has at least one valid and one invalid instance; `check_corpus()` validates them
with the `jsonschema` package (the draft each schema names; formats asserted, with strict
RFC 3339 / URI checks added for the formats jsonschema checks only with optional packages).
Instances list object keys in the schema's property order (what a model writes; xgrammar
requires it). Run as a script to check the corpus and print its size.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from schema_corpus_store import STORE, drop, extra, setp  # bench/ is on sys.path here


@dataclass(frozen=True)
class Entry:
    name: str
    kind: str
    schema: Any
    valid: tuple
    invalid: tuple


CORPUS: list[Entry] = []


def add(name: str, kind: str, schema: Any, valid: list, invalid: list) -> None:
    CORPUS.append(Entry(name, kind, schema, tuple(valid), tuple(invalid)))


S = {"type": "string"}
INT = {"type": "integer"}
N = {"type": "number"}
B = {"type": "boolean"}
DATE = {"type": "string", "format": "date"}
DATETIME = {"type": "string", "format": "date-time"}
EMAIL = {"type": "string", "format": "email"}
UUID = {"type": "string", "format": "uuid"}
URI = {"type": "string", "format": "uri"}


def strict(props: dict, **more: Any) -> dict:
    """An OpenAI strict-mode object: every property required, no others."""
    return {
        "type": "object",
        "properties": props,
        "required": list(props),
        "additionalProperties": False,
        **more,
    }


def open_obj(props: dict, required: list | None = None, **more: Any) -> dict:
    """An object as most hand-written schemas leave it: additionalProperties unset."""
    out: dict = {"type": "object", "properties": props}
    if required:
        out["required"] = required
    out.update(more)
    return out


# ---- 1. function-calling tools (parameters objects and whole tool calls) -----------------------
TOOLS = [
    (
        "get_weather",
        "Current weather for a city",
        {
            "city": {"type": "string", "description": "City name, e.g. Paris"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        ["city"],
        {"city": "Paris", "unit": "celsius"},
        [{"unit": "celsius"}, {"city": "Paris", "unit": "kelvin"}, {"city": 7}],
    ),
    (
        "search_web",
        "Search the web",
        {
            "query": {"type": "string", "minLength": 1},
            "max_results": {"type": "integer", "minimum": 1, "maximum": 20},
            "safe": {"type": "boolean", "default": True},
        },
        ["query"],
        {"query": "json schema", "max_results": 5, "safe": False},
        [{"query": ""}, {"query": "x", "max_results": 50}, {"query": "x", "safe": "yes"}],
    ),
    (
        "send_email",
        "Send an email",
        {
            "to": {"type": "array", "items": EMAIL, "minItems": 1, "maxItems": 10},
            "subject": {"type": "string", "maxLength": 120},
            "body": S,
            "cc": {"type": "array", "items": EMAIL},
        },
        ["to", "subject", "body"],
        {"to": ["ann@example.com"], "subject": "Hi", "body": "See you at 5."},
        [
            {"to": [], "subject": "Hi", "body": "x"},
            {"to": ["not an email"], "subject": "Hi", "body": "x"},
            {"to": ["a@b.io"], "body": "x"},
        ],
    ),
    (
        "create_event",
        "Create a calendar event",
        {
            "title": S,
            "start": DATETIME,
            "end": DATETIME,
            "attendees": {"type": "array", "items": EMAIL, "maxItems": 50},
            "location": S,
        },
        ["title", "start", "end"],
        {
            "title": "Standup",
            "start": "2025-03-04T09:00:00Z",
            "end": "2025-03-04T09:15:00+01:00",
            "attendees": ["bo@team.dev"],
        },
        [
            {"title": "Standup", "start": "tomorrow 9am", "end": "2025-03-04T09:15:00Z"},
            {"title": "Standup", "start": "2025-03-04T09:00:00Z"},
        ],
    ),
    (
        "book_flight",
        "Book a flight",
        {
            "origin": {"type": "string", "pattern": "^[A-Z]{3}$"},
            "destination": {"type": "string", "pattern": "^[A-Z]{3}$"},
            "date": DATE,
            "passengers": {"type": "integer", "minimum": 1, "maximum": 9},
            "cabin": {"enum": ["economy", "premium", "business", "first"]},
        },
        ["origin", "destination", "date"],
        {"origin": "CDG", "destination": "JFK", "date": "2025-07-14", "passengers": 2},
        [
            {"origin": "Paris", "destination": "JFK", "date": "2025-07-14"},
            {"origin": "CDG", "destination": "JFK", "date": "2025-07-14", "passengers": 0},
            {"origin": "CDG", "destination": "JFK", "date": "14/07/2025"},
        ],
    ),
    (
        "query_database",
        "Run a read-only SQL query",
        {
            "sql": S,
            "params": {"type": "array", "items": {"type": ["string", "number", "null"]}},
            "timeout_ms": {"type": "integer", "minimum": 0},
        },
        ["sql"],
        {"sql": "select * from t where id = ?", "params": [3, None]},
        [{"sql": "select 1", "params": [True]}, {"params": []}],
    ),
    (
        "translate",
        "Translate text",
        {
            "text": S,
            "source": {"type": "string", "pattern": "^[a-z]{2}(-[A-Z]{2})?$"},
            "target": {"type": "string", "pattern": "^[a-z]{2}(-[A-Z]{2})?$"},
        },
        ["text", "target"],
        {"text": "Bonjour", "source": "fr", "target": "en-US"},
        [{"text": "Bonjour", "target": "english"}, {"text": "Bonjour"}],
    ),
    (
        "set_reminder",
        "Set a reminder",
        {
            "message": S,
            "at": DATETIME,
            "repeat": {"enum": ["none", "daily", "weekly", "monthly"]},
        },
        ["message", "at"],
        {"message": "Call mom", "at": "2025-01-01T18:30:00-05:00", "repeat": "weekly"},
        [
            {"message": "Call mom", "at": "2025-01-01T18:30:00-05:00", "repeat": "yearly"},
            {"message": "x", "at": "2025-02-30"},
        ],
    ),
    (
        "get_stock_price",
        "Latest quote",
        {"ticker": {"type": "string", "pattern": "^[A-Z]{1,5}$"}, "exchange": S},
        ["ticker"],
        {"ticker": "AAPL", "exchange": "NASDAQ"},
        [{"ticker": "apple"}, {"ticker": "TOOLONG"}],
    ),
    (
        "create_issue",
        "Open an issue in a tracker",
        {
            "repo": {"type": "string", "pattern": "^[\\w.-]+/[\\w.-]+$"},
            "title": {"type": "string", "minLength": 3, "maxLength": 200},
            "body": S,
            "labels": {"type": "array", "items": S, "maxItems": 5},
            "priority": {"type": "integer", "minimum": 1, "maximum": 4},
        },
        ["repo", "title"],
        {"repo": "acme/widgets", "title": "Crash on start", "labels": ["bug"], "priority": 2},
        [
            {"repo": "acme", "title": "Crash on start"},
            {"repo": "acme/widgets", "title": "x"},
            {"repo": "a/b", "title": "Crash", "labels": ["1", "2", "3", "4", "5", "6"]},
        ],
    ),
    (
        "run_code",
        "Execute a snippet",
        {
            "language": {"enum": ["python", "javascript", "bash"]},
            "code": S,
            "timeout_s": {"type": "number", "exclusiveMinimum": 0, "maximum": 60},
        },
        ["language", "code"],
        {"language": "python", "code": "print(1)", "timeout_s": 2.5},
        [
            {"language": "ruby", "code": "puts 1"},
            {"language": "bash", "code": "ls", "timeout_s": 0},
        ],
    ),
    (
        "resize_image",
        "Resize an image",
        {
            "url": URI,
            "width": {"type": "integer", "minimum": 1, "maximum": 8192},
            "height": {"type": "integer", "minimum": 1, "maximum": 8192},
            "format": {"enum": ["png", "jpeg", "webp"]},
        },
        ["url", "width", "height"],
        {"url": "https://img.example.com/a.png", "width": 640, "height": 480, "format": "webp"},
        [
            {"url": "https://img.example.com/a.png", "width": 0, "height": 480},
            {"url": "https://img.example.com/a.png", "width": 640.5, "height": 480},
        ],
    ),
    (
        "lookup_user",
        "Find a user by id or email",
        {"id": UUID, "email": EMAIL},
        [],
        {"id": "0b9f5a52-3c1e-4a7b-9d2e-6f8a1c2b3d4e"},
        [{"id": "12345"}, {"email": "nobody"}],
    ),
    (
        "order_pizza",
        "Order a pizza",
        {
            "size": {"enum": ["small", "medium", "large"]},
            "toppings": {
                "type": "array",
                "items": {"enum": ["cheese", "ham", "mushroom", "olive", "pepper"]},
                "maxItems": 4,
            },
            "quantity": {"type": "integer", "minimum": 1, "maximum": 10},
            "address": S,
        },
        ["size", "quantity", "address"],
        {"size": "large", "toppings": ["ham", "olive"], "quantity": 1, "address": "1 Main St"},
        [
            {"size": "huge", "quantity": 1, "address": "1 Main St"},
            {"size": "large", "toppings": ["pineapple"], "quantity": 1, "address": "x"},
        ],
    ),
    (
        "convert_currency",
        "Convert an amount",
        {
            "amount": {"type": "number", "minimum": 0},
            "from": {"type": "string", "pattern": "^[A-Z]{3}$"},
            "to": {"type": "string", "pattern": "^[A-Z]{3}$"},
        },
        ["amount", "from", "to"],
        {"amount": 12.5, "from": "EUR", "to": "JPY"},
        [{"amount": -1, "from": "EUR", "to": "JPY"}, {"amount": 1, "from": "eur", "to": "JPY"}],
    ),
    (
        "file_write",
        "Write a file",
        {
            "path": {"type": "string", "pattern": "^(/[^/\\u0000]+)+$"},
            "content": S,
            "mode": {"enum": ["overwrite", "append"]},
            "create_dirs": B,
        },
        ["path", "content"],
        {"path": "/tmp/notes.txt", "content": "hello\nworld", "mode": "append"},
        [{"path": "relative.txt", "content": "x"}, {"path": "/tmp/a", "content": 3}],
    ),
    (
        "geocode",
        "Coordinates of an address",
        {
            "address": S,
            "bounds": {
                "type": "object",
                "properties": {
                    "lat": {"type": "number", "minimum": -90, "maximum": 90},
                    "lon": {"type": "number", "minimum": -180, "maximum": 180},
                },
                "required": ["lat", "lon"],
            },
        },
        ["address"],
        {"address": "10 Downing St", "bounds": {"lat": 51.5, "lon": -0.12}},
        [{"address": "x", "bounds": {"lat": 95, "lon": 0}}, {"address": "x", "bounds": {"lat": 1}}],
    ),
    (
        "play_music",
        "Play a track",
        {
            "track": S,
            "artist": S,
            "volume": {"type": "integer", "minimum": 0, "maximum": 100},
            "shuffle": B,
        },
        ["track"],
        {"track": "Blue in Green", "artist": "Miles Davis", "volume": 40},
        [{"track": "x", "volume": 101}, {"artist": "Miles Davis"}],
    ),
    (
        "calculator",
        "Evaluate arithmetic",
        {"expression": {"type": "string", "pattern": "^[0-9+\\-*/(). ]+$"}},
        ["expression"],
        {"expression": "(2 + 3) * 4"},
        [{"expression": "import os"}, {}],
    ),
    (
        "navigate",
        "Open a page in the browser",
        {"url": URI, "new_tab": B, "wait_for": {"enum": ["load", "idle", "none"]}},
        ["url"],
        {"url": "https://example.org/docs?page=2", "new_tab": True},
        [{"url": "https://example.org", "wait_for": "forever"}, {"new_tab": True}],
    ),
]

for tname, desc, params, req, good, bads in TOOLS:
    params_schema = open_obj(params, req or None, description=desc)
    add(f"tool-params/{tname}", "function-calling", params_schema, [good], bads)

# Whole tool calls: {"name": <enum>, "arguments": {...}} for a set of tools, as agents emit.
TOOLSETS = [("weather+search", [0, 1]), ("mail+calendar", [2, 3, 7]), ("dev tools", [9, 10, 15])]
for label, picks in TOOLSETS:
    chosen = [TOOLS[i] for i in picks]
    call = {
        "anyOf": [
            {
                "type": "object",
                "properties": {
                    "name": {"const": t[0]},
                    "arguments": {
                        "type": "object",
                        "properties": t[2],
                        "required": t[3],
                        "additionalProperties": False,
                    },
                },
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for t in chosen
        ]
    }
    first, second = chosen[0], chosen[1]
    add(
        f"tool-call/{label}",
        "function-calling",
        call,
        [
            {"name": first[0], "arguments": first[4]},
            {"name": second[0], "arguments": second[4]},
        ],
        [
            {"name": "rm_rf", "arguments": {}},
            {"name": first[0], "arguments": second[4]},
            {"name": first[0]},
        ],
    )

# The issue's tool call: a name enum of 3 and an arguments object (city, unit enum); also one
# of bench_fsm.py's schemas.
ISSUE_TOOL = {
    "type": "object",
    "properties": {
        "name": {"enum": ["get_weather", "get_time", "get_news"]},
        "arguments": {
            "type": "object",
            "properties": {"city": S, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
        },
    },
    "required": ["name", "arguments"],
}
add(
    "tool-call/name-enum",
    "function-calling",
    ISSUE_TOOL,
    [{"name": "get_time", "arguments": {"city": "Oslo"}}],
    [{"name": "get_date", "arguments": {"city": "Oslo"}}, {"name": "get_time", "arguments": {}}],
)

# ---- 2. OpenAI strict response formats --------------------------------------------------------
add(
    "strict/math-steps",
    "response-format",
    strict(
        {
            "steps": {
                "type": "array",
                "items": strict({"explanation": S, "output": S}),
            },
            "final_answer": S,
        }
    ),
    [{"steps": [{"explanation": "add", "output": "4"}], "final_answer": "4"}],
    [
        {"steps": [{"explanation": "add"}], "final_answer": "4"},
        {"steps": [], "final_answer": 4},
        {"steps": [], "final_answer": "4", "confidence": 1},
    ],
)
add(
    "strict/entities",
    "response-format",
    strict(
        {
            "entities": {
                "type": "array",
                "items": strict(
                    {
                        "text": S,
                        "type": {"type": "string", "enum": ["PERSON", "ORG", "LOC", "DATE"]},
                        "start": {"type": "integer", "minimum": 0},
                    }
                ),
            }
        }
    ),
    [{"entities": [{"text": "Ada", "type": "PERSON", "start": 0}]}, {"entities": []}],
    [{"entities": [{"text": "Ada", "type": "HUMAN", "start": 0}]}, {"entities": {}}],
)
add(
    "strict/sentiment",
    "response-format",
    strict(
        {
            "label": {"type": "string", "enum": ["positive", "negative", "neutral"]},
            "score": {"type": "number", "minimum": 0, "maximum": 1},
            "rationale": {"type": ["string", "null"]},
        }
    ),
    [
        {"label": "positive", "score": 0.93, "rationale": None},
        {"label": "neutral", "score": 0, "rationale": "flat"},
    ],
    [
        {"label": "positive", "score": 1.5, "rationale": None},
        {"label": "happy", "score": 0.5, "rationale": None},
        {"label": "neutral", "score": 0.5},
    ],
)
add(
    "strict/calendar-extraction",
    "response-format",
    strict(
        {
            "name": S,
            "date": S,
            "participants": {"type": "array", "items": S},
        }
    ),
    [{"name": "science fair", "date": "Friday", "participants": ["Alice", "Bob"]}],
    [{"name": "science fair", "date": "Friday"}, {"name": 1, "date": "x", "participants": []}],
)
add(
    "strict/moderation",
    "response-format",
    strict(
        {
            "is_violating": B,
            "category": {
                "type": ["string", "null"],
                "enum": ["violence", "sexual", "self_harm", None],
            },
            "explanation_if_violating": {"type": ["string", "null"]},
        }
    ),
    [{"is_violating": False, "category": None, "explanation_if_violating": None}],
    [
        {"is_violating": "no", "category": None, "explanation_if_violating": None},
        {"is_violating": True, "category": "spam", "explanation_if_violating": "x"},
    ],
)
add(
    "strict/ticket-triage",
    "response-format",
    strict(
        {
            "category": {"enum": ["billing", "bug", "feature", "account", "other"]},
            "urgency": {"enum": ["low", "medium", "high"]},
            "summary": S,
            "needs_human": B,
            "tags": {"type": "array", "items": S},
        }
    ),
    [
        {
            "category": "bug",
            "urgency": "high",
            "summary": "App crashes on login",
            "needs_human": True,
            "tags": ["ios", "login"],
        }
    ],
    [
        {"category": "bug", "urgency": "urgent", "summary": "x", "needs_human": True, "tags": []},
        {"category": "bug", "urgency": "low", "summary": "x", "needs_human": True},
    ],
)
add(
    "strict/recipe",
    "response-format",
    strict(
        {
            "title": S,
            "servings": INT,
            "ingredients": {
                "type": "array",
                "items": strict({"item": S, "quantity": N, "unit": {"type": ["string", "null"]}}),
            },
            "steps": {"type": "array", "items": S},
        }
    ),
    [
        {
            "title": "Pancakes",
            "servings": 4,
            "ingredients": [
                {"item": "flour", "quantity": 200, "unit": "g"},
                {"item": "eggs", "quantity": 2, "unit": None},
            ],
            "steps": ["Mix", "Fry"],
        }
    ],
    [
        {"title": "Pancakes", "servings": 4.5, "ingredients": [], "steps": []},
        {"title": "P", "servings": 4, "ingredients": [{"item": "flour"}], "steps": []},
    ],
)
add(
    "strict/ui-defs",
    "response-format",
    {
        "type": "object",
        "properties": {"ui": {"$ref": "#/$defs/component"}},
        "required": ["ui"],
        "additionalProperties": False,
        "$defs": {
            "attribute": strict({"name": S, "value": S}),
            "component": strict(
                {
                    "type": {"enum": ["div", "button", "header", "section", "field", "form"]},
                    "label": S,
                    "attributes": {"type": "array", "items": {"$ref": "#/$defs/attribute"}},
                }
            ),
        },
    },
    [{"ui": {"type": "button", "label": "OK", "attributes": [{"name": "id", "value": "ok"}]}}],
    [
        {"ui": {"type": "span", "label": "OK", "attributes": []}},
        {"ui": {"type": "div", "label": "x", "attributes": [{"name": "id"}]}},
    ],
)
add(
    "strict/anyof-payment",
    "response-format",
    strict(
        {
            "payment": {
                "anyOf": [
                    strict(
                        {
                            "kind": {"const": "card"},
                            "last4": {"type": "string", "pattern": "^[0-9]{4}$"},
                        }
                    ),
                    strict({"kind": {"const": "bank"}, "iban": S}),
                ]
            }
        }
    ),
    [{"payment": {"kind": "card", "last4": "4242"}}, {"payment": {"kind": "bank", "iban": "DE89"}}],
    [{"payment": {"kind": "card", "last4": "42"}}, {"payment": {"kind": "cash"}}],
)
add(
    "strict/research-paper",
    "response-format",
    strict(
        {
            "title": S,
            "authors": {"type": "array", "items": S},
            "abstract": S,
            "keywords": {"type": "array", "items": S},
            "year": {"type": ["integer", "null"]},
        }
    ),
    [
        {
            "title": "Attention",
            "authors": ["A. Author"],
            "abstract": "We...",
            "keywords": ["nlp"],
            "year": 2017,
        }
    ],
    [{"title": "A", "authors": "A. Author", "abstract": "x", "keywords": [], "year": None}],
)
add(
    "strict/invoice-defs",
    "response-format",
    {
        "type": "object",
        "$defs": {
            "money": strict({"amount": N, "currency": {"enum": ["USD", "EUR", "GBP"]}}),
            "line": strict(
                {"description": S, "quantity": INT, "unit_price": {"$ref": "#/$defs/money"}}
            ),
        },
        "properties": {
            "invoice_number": S,
            "lines": {"type": "array", "items": {"$ref": "#/$defs/line"}},
            "total": {"$ref": "#/$defs/money"},
        },
        "required": ["invoice_number", "lines", "total"],
        "additionalProperties": False,
    },
    [
        {
            "invoice_number": "INV-1",
            "lines": [
                {
                    "description": "Widget",
                    "quantity": 2,
                    "unit_price": {"amount": 9.5, "currency": "EUR"},
                }
            ],
            "total": {"amount": 19, "currency": "EUR"},
        }
    ],
    [
        {"invoice_number": "INV-1", "lines": [], "total": {"amount": 19, "currency": "JPY"}},
        {
            "invoice_number": "INV-1",
            "lines": [{"description": "W"}],
            "total": {"amount": 1, "currency": "USD"},
        },
    ],
)
add(
    "strict/meeting-notes",
    "response-format",
    strict(
        {
            "attendees": {"type": "array", "items": S},
            "decisions": {"type": "array", "items": S},
            "action_items": {
                "type": "array",
                "items": strict({"owner": S, "task": S, "due": {"type": ["string", "null"]}}),
            },
        }
    ),
    [
        {
            "attendees": ["Ann", "Raj"],
            "decisions": ["ship friday"],
            "action_items": [{"owner": "Raj", "task": "tag release", "due": None}],
        }
    ],
    [{"attendees": ["Ann"], "decisions": [], "action_items": [{"owner": "Raj", "task": "x"}]}],
)
add(
    "strict/classification-multi",
    "response-format",
    strict(
        {
            "labels": {
                "type": "array",
                "items": {"enum": ["sports", "politics", "tech", "health", "finance"]},
            },
            "primary": {"enum": ["sports", "politics", "tech", "health", "finance"]},
        }
    ),
    [{"labels": ["tech", "finance"], "primary": "tech"}],
    [{"labels": ["cooking"], "primary": "tech"}, {"labels": [], "primary": None}],
)
add(
    "strict/product-review",
    "response-format",
    strict(
        {
            "rating": {"type": "integer", "minimum": 1, "maximum": 5},
            "pros": {"type": "array", "items": S},
            "cons": {"type": "array", "items": S},
            "would_recommend": B,
        }
    ),
    [{"rating": 4, "pros": ["fast"], "cons": [], "would_recommend": True}],
    [
        {"rating": 6, "pros": [], "cons": [], "would_recommend": True},
        {"rating": 3, "pros": [], "cons": [], "would_recommend": "maybe"},
    ],
)
add(
    "strict/nullable-address",
    "response-format",
    strict(
        {
            "name": S,
            "address": {
                "anyOf": [strict({"street": S, "city": S, "postcode": S}), {"type": "null"}]
            },
        }
    ),
    [
        {"name": "Ann", "address": None},
        {"name": "Bo", "address": {"street": "1 High St", "city": "Leeds", "postcode": "LS1"}},
    ],
    [{"name": "Ann", "address": {"street": "1 High St"}}, {"name": "Ann", "address": "Leeds"}],
)

# ---- 3. data records: nested objects, formats, patterns, bounded arrays -----------------------
PERSON4 = open_obj(
    {
        "name": S,
        "age": {"type": "integer", "minimum": 0},
        "email": EMAIL,
        "tags": {"type": "array", "items": S},
    },
    ["name", "age"],
)
P4 = {"name": "Ada Lovelace", "age": 36, "email": "ada@example.org", "tags": ["math"]}
add(
    "record/person-open",
    "record",
    PERSON4,
    [P4, {"name": "Bo", "age": 3}, extra(P4, "", "nickname", "Countess")],
    [setp(P4, "age", -1), drop(P4, "name"), setp(P4, "email", "ada-at-example")],
)
add(
    "record/person-closed",
    "record",
    {**PERSON4, "additionalProperties": False, "properties": {**PERSON4["properties"], "email": S}},
    [P4],
    [extra(P4, "", "nickname", "C"), setp(P4, "tags", "math")],
)
ADDRESS = open_obj(
    {
        "street": S,
        "city": S,
        "postal_code": {"type": "string", "pattern": "^[0-9]{5}(-[0-9]{4})?$"},
        "country": {"type": "string", "minLength": 2, "maxLength": 2},
    },
    ["street", "city", "country"],
)
ADDR = {"street": "1 Infinite Loop", "city": "Cupertino", "postal_code": "95014", "country": "US"}
add(
    "record/address",
    "record",
    ADDRESS,
    [ADDR, setp(ADDR, "postal_code", "95014-2083")],
    [setp(ADDR, "postal_code", "9501"), setp(ADDR, "country", "USA"), drop(ADDR, "city")],
)
ORDER = {
    "type": "object",
    "properties": {
        "order_id": UUID,
        "created": DATETIME,
        "customer": open_obj({"name": S, "email": EMAIL}, ["name"]),
        "shipping": ADDRESS,
        "items": {
            "type": "array",
            "minItems": 1,
            "maxItems": 20,
            "items": open_obj(
                {
                    "sku": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{4}$"},
                    "qty": {"type": "integer", "minimum": 1},
                    "price": {"type": "number", "minimum": 0},
                },
                ["sku", "qty", "price"],
            ),
        },
        "status": {"enum": ["pending", "paid", "shipped", "cancelled"]},
    },
    "required": ["order_id", "customer", "items", "status"],
}
ORD = {
    "order_id": "6f1c2e4a-8b3d-4c5e-9f7a-1b2c3d4e5f60",
    "created": "2024-11-05T14:03:00Z",
    "customer": {"name": "Bob", "email": "bob@shop.io"},
    "shipping": ADDR,
    "items": [{"sku": "AB-1234", "qty": 2, "price": 9.99}],
    "status": "paid",
}
add(
    "record/order",
    "record",
    ORDER,
    [ORD, drop(ORD, "shipping")],
    [
        setp(ORD, "items", []),
        setp(ORD, "items.0.sku", "ab1234"),
        setp(ORD, "status", "lost"),
        setp(ORD, "order_id", "order-1"),
    ],
)
add(
    "record/blog-post",
    "record",
    open_obj(
        {
            "id": INT,
            "slug": {"type": "string", "pattern": "^[a-z0-9]+(-[a-z0-9]+)*$"},
            "title": {"type": "string", "maxLength": 80},
            "published": DATE,
            "author": open_obj({"name": S, "url": URI}, ["name"]),
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 6},
            "draft": B,
        },
        ["id", "slug", "title"],
    ),
    [
        {
            "id": 12,
            "slug": "hello-world",
            "title": "Hello, world",
            "published": "2023-06-01",
            "author": {"name": "Kim", "url": "https://kim.dev/"},
            "tags": ["intro"],
            "draft": False,
        }
    ],
    [
        {"id": 12, "slug": "Hello World", "title": "x"},
        {"id": 12, "slug": "a", "title": "x", "published": "June 1"},
        {"id": "12", "slug": "a", "title": "x"},
    ],
)
add(
    "record/comment-thread",
    "record",
    {
        "$defs": {
            "comment": open_obj(
                {"author": S, "text": S, "likes": {"type": "integer", "minimum": 0}},
                ["author", "text"],
            )
        },
        "type": "object",
        "properties": {
            "post_id": INT,
            "comments": {"type": "array", "items": {"$ref": "#/$defs/comment"}, "maxItems": 50},
        },
        "required": ["post_id", "comments"],
    },
    [{"post_id": 1, "comments": [{"author": "a", "text": "nice", "likes": 3}]}],
    [
        {"post_id": 1, "comments": [{"author": "a"}]},
        {"post_id": 1, "comments": [{"author": "a", "text": "x", "likes": -2}]},
    ],
)
add(
    "record/geojson-like",
    "record",
    {
        "oneOf": [
            strict(
                {
                    "type": {"const": "Point"},
                    "coordinates": {
                        "type": "array",
                        "items": N,
                        "minItems": 2,
                        "maxItems": 3,
                    },
                }
            ),
            strict(
                {
                    "type": {"const": "LineString"},
                    "coordinates": {
                        "type": "array",
                        "minItems": 2,
                        "items": {"type": "array", "items": N, "minItems": 2, "maxItems": 3},
                    },
                }
            ),
        ]
    },
    [
        {"type": "Point", "coordinates": [2.35, 48.85]},
        {"type": "LineString", "coordinates": [[0, 0], [1, 1.5]]},
    ],
    [
        {"type": "Point", "coordinates": [2.35]},
        {"type": "LineString", "coordinates": [[0, 0]]},
        {"type": "Polygon", "coordinates": []},
    ],
)
add(
    "record/bank-transaction",
    "record",
    open_obj(
        {
            "id": UUID,
            "amount": {"type": "number", "multipleOf": 0.01},
            "currency": {"type": "string", "pattern": "^[A-Z]{3}$"},
            "booked_at": DATETIME,
            "counterparty": open_obj(
                {
                    "name": S,
                    "iban": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}[A-Z0-9]{10,30}$"},
                }
            ),
            "direction": {"enum": ["debit", "credit"]},
        },
        ["id", "amount", "currency", "direction"],
    ),
    [
        {
            "id": "a3bb189e-8bf9-4888-9912-ace4e6543002",
            "amount": 42.5,
            "currency": "EUR",
            "booked_at": "2024-02-29T23:59:59Z",
            "counterparty": {"name": "ACME", "iban": "DE89370400440532013000"},
            "direction": "debit",
        }
    ],
    [
        {
            "id": "a3bb189e-8bf9-4888-9912-ace4e6543002",
            "amount": 42.5,
            "currency": "EUR",
            "direction": "sideways",
        },
        {
            "id": "a3bb189e-8bf9-4888-9912-ace4e6543002",
            "amount": 1,
            "currency": "EUR",
            "direction": "debit",
            "counterparty": {"iban": "nope"},
        },
    ],
)
add(
    "record/log-entry",
    "record",
    open_obj(
        {
            "ts": DATETIME,
            "level": {"enum": ["DEBUG", "INFO", "WARN", "ERROR"]},
            "logger": S,
            "message": S,
            "context": {"type": "object"},
            "host": {"type": "string", "format": "ipv4"},
        },
        ["ts", "level", "message"],
    ),
    [
        {
            "ts": "2025-05-05T05:05:05.123Z",
            "level": "WARN",
            "logger": "db",
            "message": "slow query",
            "context": {"ms": 812, "table": "users"},
            "host": "10.0.0.12",
        }
    ],
    [
        {"ts": "2025-05-05T05:05:05Z", "level": "FATAL", "message": "x"},
        {"ts": "2025-05-05T05:05:05Z", "level": "INFO", "message": "x", "host": "10.0.0"},
        {"ts": "2025-05-05T05:05:05Z", "level": "INFO", "message": "x", "context": []},
    ],
)
add(
    "record/sensor-readings",
    "record",
    open_obj(
        {
            "device": {"type": "string", "pattern": "^dev-[0-9a-f]{6}$"},
            "readings": {
                "type": "array",
                "maxItems": 8,
                "items": open_obj(
                    {
                        "t": {"type": "integer", "minimum": 0},
                        "celsius": {"type": "number", "minimum": -80, "maximum": 150},
                    },
                    ["t", "celsius"],
                ),
            },
        },
        ["device", "readings"],
    ),
    [{"device": "dev-00ff1a", "readings": [{"t": 0, "celsius": 21.5}, {"t": 60, "celsius": 21.7}]}],
    [
        {"device": "dev-XYZ", "readings": []},
        {"device": "dev-00ff1a", "readings": [{"t": 0, "celsius": 200}]},
    ],
)
add(
    "record/movie",
    "record",
    open_obj(
        {
            "title": S,
            "year": {"type": "integer", "minimum": 1888, "maximum": 2100},
            "genres": {
                "type": "array",
                "items": {"enum": ["drama", "comedy", "action", "horror", "sci-fi", "documentary"]},
                "minItems": 1,
            },
            "rating": {"type": "number", "minimum": 0, "maximum": 10},
            "cast": {"type": "array", "items": open_obj({"actor": S, "role": S}, ["actor"])},
        },
        ["title", "year"],
    ),
    [
        {
            "title": "Alien",
            "year": 1979,
            "genres": ["sci-fi", "horror"],
            "rating": 8.5,
            "cast": [{"actor": "S. Weaver", "role": "Ripley"}],
        }
    ],
    [
        {"title": "Alien", "year": 1700},
        {"title": "Alien", "year": 1979, "genres": []},
        {"title": "Alien", "year": 1979, "genres": ["western"]},
    ],
)
add(
    "record/hotel-booking",
    "record",
    open_obj(
        {
            "hotel_id": INT,
            "check_in": DATE,
            "check_out": DATE,
            "guests": open_obj(
                {
                    "adults": {"type": "integer", "minimum": 1, "maximum": 8},
                    "children": {"type": "integer", "minimum": 0, "maximum": 8},
                },
                ["adults"],
            ),
            "room": {"enum": ["single", "double", "suite"]},
            "breakfast": B,
            "notes": {"type": "string", "maxLength": 500},
        },
        ["hotel_id", "check_in", "check_out", "guests"],
    ),
    [
        {
            "hotel_id": 77,
            "check_in": "2025-08-01",
            "check_out": "2025-08-05",
            "guests": {"adults": 2, "children": 1},
            "room": "double",
            "breakfast": True,
        }
    ],
    [
        {
            "hotel_id": 77,
            "check_in": "2025-08-01",
            "check_out": "2025-08-05",
            "guests": {"adults": 0},
        },
        {
            "hotel_id": 77,
            "check_in": "2025-8-1",
            "check_out": "2025-08-05",
            "guests": {"adults": 1},
        },
    ],
)
add(
    "record/library-book",
    "record",
    open_obj(
        {
            "isbn": {"type": "string", "pattern": "^(97[89])?[0-9]{9}[0-9X]$"},
            "title": S,
            "authors": {"type": "array", "items": S, "minItems": 1, "maxItems": 10},
            "edition": {"type": "integer", "minimum": 1},
            "available": B,
        },
        ["isbn", "title", "authors"],
    ),
    [
        {
            "isbn": "9780262033848",
            "title": "Introduction to Algorithms",
            "authors": ["Cormen", "Leiserson"],
            "edition": 3,
            "available": True,
        }
    ],
    [
        {"isbn": "978-0262", "title": "x", "authors": ["a"]},
        {"isbn": "9780262033848", "title": "x", "authors": []},
    ],
)
add(
    "record/employee",
    "record",
    open_obj(
        {
            "employee_id": {"type": "string", "pattern": "^E[0-9]{5}$"},
            "name": open_obj({"first": S, "last": S}, ["first", "last"]),
            "hired": DATE,
            "salary": {"type": "number", "exclusiveMinimum": 0},
            "manager": {"type": ["string", "null"]},
            "skills": {"type": "array", "items": S, "uniqueItems": True},
        },
        ["employee_id", "name", "hired"],
    ),
    [
        {
            "employee_id": "E00042",
            "name": {"first": "Li", "last": "Na"},
            "hired": "2019-09-09",
            "salary": 85000,
            "manager": None,
            "skills": ["go", "sql"],
        }
    ],
    [
        {"employee_id": "E42", "name": {"first": "Li", "last": "Na"}, "hired": "2019-09-09"},
        {"employee_id": "E00042", "name": {"first": "Li"}, "hired": "2019-09-09"},
        {
            "employee_id": "E00042",
            "name": {"first": "Li", "last": "Na"},
            "hired": "2019-09-09",
            "skills": ["go", "go"],
        },
    ],
)
add(
    "record/http-request",
    "record",
    open_obj(
        {
            "method": {"enum": ["GET", "POST", "PUT", "PATCH", "DELETE"]},
            "url": URI,
            "headers": {"type": "object", "additionalProperties": {"type": "string"}},
            "body": {"type": ["object", "string", "null"]},
            "timeout": {"type": "number", "minimum": 0},
        },
        ["method", "url"],
    ),
    [
        {
            "method": "POST",
            "url": "https://api.example.com/v1/items",
            "headers": {"Content-Type": "application/json"},
            "body": {"name": "x"},
        },
        {"method": "GET", "url": "http://localhost:8080/health"},
    ],
    [
        {"method": "FETCH", "url": "https://api.example.com"},
        {"method": "GET", "url": "https://api.example.com", "headers": {"X-Retry": 3}},
        {"method": "GET", "url": "https://api.example.com", "body": 12},
    ],
)
add(
    "record/weather-report",
    "record",
    open_obj(
        {
            "location": open_obj({"lat": N, "lon": N, "name": S}, ["lat", "lon"]),
            "observed": DATETIME,
            "temperature": open_obj({"value": N, "unit": {"enum": ["C", "F"]}}, ["value", "unit"]),
            "conditions": {"enum": ["clear", "cloudy", "rain", "snow", "fog", "storm"]},
            "wind_kph": {"type": "number", "minimum": 0},
            "forecast": {
                "type": "array",
                "maxItems": 7,
                "items": open_obj({"day": DATE, "high": N, "low": N}, ["day"]),
            },
        },
        ["location", "temperature", "conditions"],
    ),
    [
        {
            "location": {"lat": 59.9, "lon": 10.7, "name": "Oslo"},
            "observed": "2025-01-10T12:00:00Z",
            "temperature": {"value": -4.5, "unit": "C"},
            "conditions": "snow",
            "wind_kph": 12,
            "forecast": [{"day": "2025-01-11", "high": -1, "low": -7}],
        }
    ],
    [
        {
            "location": {"lat": 1, "lon": 2},
            "temperature": {"value": 3, "unit": "K"},
            "conditions": "clear",
        },
        {
            "location": {"lat": 1, "lon": 2},
            "temperature": {"value": 3, "unit": "C"},
            "conditions": "hail",
        },
    ],
)

# ---- 4. unions, nullable, tuples, maps, hard keywords ------------------------------------------
add(
    "union/shape-discriminated",
    "union",
    {
        "$defs": {
            "circle": strict(
                {"kind": {"const": "circle"}, "r": {"type": "number", "exclusiveMinimum": 0}}
            ),
            "rect": strict(
                {
                    "kind": {"const": "rect"},
                    "w": {"type": "number", "exclusiveMinimum": 0},
                    "h": {"type": "number", "exclusiveMinimum": 0},
                }
            ),
        },
        "type": "object",
        "properties": {
            "shapes": {
                "type": "array",
                "items": {"oneOf": [{"$ref": "#/$defs/circle"}, {"$ref": "#/$defs/rect"}]},
            }
        },
        "required": ["shapes"],
    },
    [{"shapes": [{"kind": "circle", "r": 1}, {"kind": "rect", "w": 2, "h": 3}]}],
    [
        {"shapes": [{"kind": "circle", "r": 0}]},
        {"shapes": [{"kind": "triangle"}]},
        {"shapes": [{"kind": "rect", "w": 2}]},
    ],
)
add(
    "union/string-or-list",
    "union",
    open_obj({"to": {"anyOf": [EMAIL, {"type": "array", "items": EMAIL, "minItems": 1}]}}, ["to"]),
    [{"to": "a@b.co"}, {"to": ["a@b.co", "c@d.co"]}],
    [{"to": []}, {"to": 3}, {"to": ["nope"]}],
)
add(
    "union/int-or-numeric-string",
    "union",
    {"anyOf": [{"type": "integer"}, {"type": "string", "pattern": "^[0-9]+$"}]},
    [42, "42"],
    ["4x2", 4.5, None],
)
add(
    "union/nullable-types",
    "union",
    open_obj(
        {
            "a": {"type": ["integer", "null"]},
            "b": {"type": ["string", "boolean"]},
            "c": {"oneOf": [{"type": "null"}, DATE]},
        }
    ),
    [{"a": None, "b": True, "c": None}, {"a": 3, "b": "x", "c": "2020-01-01"}],
    [{"a": "3"}, {"b": None}, {"c": "yesterday"}],
)
add(
    "union/event-types",
    "union",
    {
        "type": "object",
        "properties": {
            "event": {
                "oneOf": [
                    open_obj({"type": {"const": "click"}, "x": INT, "y": INT}, ["type", "x", "y"]),
                    open_obj(
                        {
                            "type": {"const": "key"},
                            "key": {"type": "string", "minLength": 1, "maxLength": 1},
                        },
                        ["type", "key"],
                    ),
                    open_obj({"type": {"const": "scroll"}, "dy": N}, ["type", "dy"]),
                ]
            },
            "ts": {"type": "integer", "minimum": 0},
        },
        "required": ["event", "ts"],
    },
    [
        {"event": {"type": "click", "x": 3, "y": 4}, "ts": 1},
        {"event": {"type": "key", "key": "a"}, "ts": 2},
    ],
    [
        {"event": {"type": "key", "key": "ab"}, "ts": 2},
        {"event": {"type": "hover"}, "ts": 1},
        {"event": {"type": "scroll"}, "ts": 1},
    ],
)
add(
    "tuple/prefix-items",
    "array",
    {"type": "array", "prefixItems": [S, INT, B], "items": False, "minItems": 2},
    [["a", 1, True], ["a", 1]],
    [["a", "1"], ["a", 1, True, 4], ["a"]],
)
add(
    "array/bounded-tags",
    "array",
    {
        "type": "array",
        "items": {"type": "string", "minLength": 1, "maxLength": 10},
        "minItems": 1,
        "maxItems": 5,
    },
    [["ai", "json", "fsm"], ["x"]],
    [[], ["a", "b", "c", "d", "e", "f"], ["waytoolongtag"], [""]],
)
add(
    "array/matrix",
    "array",
    {
        "type": "array",
        "maxItems": 4,
        "items": {"type": "array", "items": N, "minItems": 2, "maxItems": 2},
    },
    [[[1, 2], [3.5, -4]]],
    [[[1, 2, 3]], [[1, "2"]]],
)
add(
    "array/unique-enum",
    "array",
    {"type": "array", "items": {"enum": ["r", "w", "x"]}, "uniqueItems": True, "maxItems": 3},
    [["r", "w"], []],
    [["r", "r"], ["z"]],
)
add(
    "map/labels",
    "map",
    {"type": "object", "additionalProperties": {"type": "string", "maxLength": 63}},
    [{"app": "web", "tier": "frontend"}, {}],
    [{"app": 3}, {"app": "x" * 64}],
)
add(
    "map/pattern-properties",
    "map",
    {
        "type": "object",
        "patternProperties": {
            "^x-[a-z]+$": S,
            "^[0-9]{3}$": open_obj({"description": S}, ["description"]),
        },
        "additionalProperties": False,
    },
    [{"200": {"description": "OK"}, "x-internal": "yes"}],
    [{"200": {}}, {"OK": {"description": "OK"}}, {"x-a": 1}],
)
add(
    "map/property-names",
    "map",
    {
        "type": "object",
        "propertyNames": {"pattern": "^[a-z_][a-z0-9_]*$"},
        "additionalProperties": INT,
    },
    [{"retries": 3, "max_wait": 10}],
    [{"Retries": 3}, {"retries": "3"}],
)
add(
    "map/min-max-properties",
    "map",
    {"type": "object", "additionalProperties": N, "minProperties": 1, "maxProperties": 3},
    [{"a": 1}, {"a": 1, "b": 2, "c": 3}],
    [{}, {"a": 1, "b": 2, "c": 3, "d": 4}],
)
add(
    "keyword/dependent-required",
    "keyword",
    open_obj(
        {"name": S, "credit_card": S, "billing_address": S},
        ["name"],
        dependentRequired={"credit_card": ["billing_address"]},
    ),
    [{"name": "A"}, {"name": "A", "credit_card": "4111", "billing_address": "x"}],
    [{"name": "A", "credit_card": "4111"}],
)
add(
    "keyword/not-empty",
    "keyword",
    open_obj({"code": {"type": "string", "not": {"enum": ["", "none", "null"]}}}, ["code"]),
    [{"code": "A1"}],
    [{"code": ""}, {"code": "none"}],
)
add(
    "keyword/if-then-else",
    "keyword",
    {
        "type": "object",
        "properties": {"country": {"enum": ["US", "CA"]}, "postal_code": S},
        "required": ["country", "postal_code"],
        "if": {"properties": {"country": {"const": "US"}}},
        "then": {"properties": {"postal_code": {"pattern": "^[0-9]{5}$"}}},
        "else": {"properties": {"postal_code": {"pattern": "^[A-Z][0-9][A-Z] [0-9][A-Z][0-9]$"}}},
    },
    [{"country": "US", "postal_code": "20500"}, {"country": "CA", "postal_code": "K1A 0B1"}],
    [{"country": "US", "postal_code": "K1A 0B1"}, {"country": "CA", "postal_code": "20500"}],
)
add(
    "keyword/allof-mixin",
    "keyword",
    {
        "$defs": {
            "timestamps": open_obj({"created": DATETIME, "updated": DATETIME}, ["created"]),
            "named": open_obj({"name": {"type": "string", "minLength": 1}}, ["name"]),
        },
        "allOf": [{"$ref": "#/$defs/named"}, {"$ref": "#/$defs/timestamps"}],
    },
    [{"name": "x", "created": "2020-01-01T00:00:00Z"}],
    [{"name": "", "created": "2020-01-01T00:00:00Z"}, {"name": "x"}],
)
add(
    "keyword/const-version",
    "keyword",
    open_obj(
        {"version": {"const": 2}, "data": {"type": "array", "items": INT}}, ["version", "data"]
    ),
    [{"version": 2, "data": [1, 2]}],
    [{"version": 1, "data": []}, {"version": 2, "data": [1.5]}],
)

# ---- 5. primitives: formats, patterns, numbers -------------------------------------------------
PRIMS = [
    ("date", DATE, ["2024-02-29", "1999-12-31"], ["2024-13-01", "24-01-01", "2024-02-30"]),
    (
        "date-time",
        DATETIME,
        ["2024-05-01T10:20:30Z", "2024-05-01T10:20:30.5+05:30"],
        ["2024-05-01 10:20", "2024-05-01T25:00:00Z"],
    ),
    (
        "time",
        {"type": "string", "format": "time"},
        ["10:20:30Z", "23:59:59+01:00"],
        ["10:20", "24:00:00Z"],
    ),
    ("email", EMAIL, ["a.b+c@example.co.uk"], ["no-at-sign", "example.com"]),
    (
        "uuid",
        UUID,
        ["123e4567-e89b-12d3-a456-426614174000"],
        ["123e4567e89b12d3a456426614174000", "xyz"],
    ),
    (
        "uri",
        URI,
        ["https://example.com/a/b?c=d#e", "urn:isbn:0451450523"],
        ["not a uri", "//no-scheme"],
    ),
    ("ipv4", {"type": "string", "format": "ipv4"}, ["192.168.0.1"], ["256.1.1.1", "1.2.3"]),
    (
        "hex-color",
        {"type": "string", "pattern": "^#([0-9a-fA-F]{3}|[0-9a-fA-F]{6})$"},
        ["#fff", "#00AAff"],
        ["fff", "#12345"],
    ),
    (
        "semver",
        {
            "type": "string",
            "pattern": "^(0|[1-9][0-9]*)\\.(0|[1-9][0-9]*)\\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$",
        },
        ["1.2.3", "0.10.0-beta.1"],
        ["1.2", "01.2.3"],
    ),
    (
        "phone-e164",
        {"type": "string", "pattern": "^\\+[1-9][0-9]{7,14}$"},
        ["+14155550123"],
        ["4155550123", "+0123456789"],
    ),
    (
        "percent",
        {"type": "number", "minimum": 0, "maximum": 100},
        [0, 55.5, 100],
        [-0.1, 100.01, "50"],
    ),
    ("port", {"type": "integer", "minimum": 1, "maximum": 65535}, [80, 65535], [0, 70000, 80.5]),
    ("half-steps", {"type": "number", "multipleOf": 0.5, "minimum": 0}, [0, 19.5, 3], [-1, 1.25]),
    ("even", {"type": "integer", "multipleOf": 2}, [0, 42, -8], [3, 2.5]),
    ("enum-mixed", {"enum": ["auto", 0, 1, True, None]}, ["auto", 0, None], ["Auto", 2, False]),
    (
        "bounded-string",
        {"type": "string", "minLength": 3, "maxLength": 8},
        ["abc", "abcdefgh"],
        ["ab", "abcdefghi"],
    ),
    (
        "country-enum",
        {"type": "string", "enum": ["US", "GB", "FR", "DE", "JP", "IN", "BR", "CN"]},
        ["FR"],
        ["fr", "ES"],
    ),
]
for pname, pschema, goods, bads in PRIMS:
    add(f"primitive/{pname}", "primitive", pschema, goods, bads)

# ---- 6. Kubernetes-like manifests ----------------------------------------------------------------
DNS = {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63}
LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
QUANTITY = {
    "anyOf": [
        {"type": "integer"},
        {"type": "string", "pattern": "^[0-9]+(\\.[0-9]+)?(m|Ki|Mi|Gi|Ti)?$"},
    ],
    "x-kubernetes-int-or-string": True,
}
META = {
    "type": "object",
    "description": "Standard object metadata.",
    "properties": {"name": DNS, "namespace": DNS, "labels": LABELS, "annotations": LABELS},
    "required": ["name"],
}
CONTAINER = {
    "type": "object",
    "properties": {
        "name": DNS,
        "image": {"type": "string", "minLength": 1},
        "command": {"type": "array", "items": S},
        "args": {"type": "array", "items": S},
        "ports": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "containerPort": {"type": "integer", "minimum": 1, "maximum": 65535},
                    "protocol": {"enum": ["TCP", "UDP", "SCTP"], "default": "TCP"},
                    "name": S,
                },
                "required": ["containerPort"],
            },
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["containerPort", "protocol"],
        },
        "env": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"name": S, "value": S},
                "required": ["name"],
            },
        },
        "resources": {
            "type": "object",
            "properties": {
                "limits": {"type": "object", "additionalProperties": QUANTITY},
                "requests": {"type": "object", "additionalProperties": QUANTITY},
            },
        },
        "imagePullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]},
    },
    "required": ["name", "image"],
}
C1 = {
    "name": "web",
    "image": "nginx:1.27",
    "ports": [{"containerPort": 80, "protocol": "TCP"}],
    "resources": {"limits": {"cpu": "500m", "memory": "128Mi"}},
}


def k8s(kind: str, spec: dict, spec_required: list | None = None, group: str = "v1") -> dict:
    spec_schema = {"type": "object", "properties": spec}
    if spec_required:
        spec_schema["required"] = spec_required
    return {
        "type": "object",
        "x-kubernetes-group-version-kind": [{"group": "", "kind": kind, "version": group}],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"enum": [kind]},
            "metadata": META,
            "spec": spec_schema,
        },
        "required": ["apiVersion", "kind", "metadata"],
    }


POD = k8s(
    "Pod",
    {
        "containers": {"type": "array", "items": CONTAINER, "minItems": 1},
        "restartPolicy": {"enum": ["Always", "OnFailure", "Never"]},
        "nodeSelector": LABELS,
    },
    ["containers"],
)
POD_OK = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "web-1", "labels": {"app": "web"}},
    "spec": {"containers": [C1], "restartPolicy": "Always"},
}
add(
    "k8s/pod",
    "kubernetes",
    POD,
    [POD_OK],
    [
        setp(POD_OK, "metadata.name", "Web_1"),
        setp(POD_OK, "spec.containers", []),
        setp(POD_OK, "spec.containers.0.ports.0.containerPort", 70000),
        setp(POD_OK, "spec.containers.0.resources.limits.cpu", "half"),
    ],
)
DEPLOY = k8s(
    "Deployment",
    {
        "replicas": {"type": "integer", "minimum": 0},
        "selector": {
            "type": "object",
            "properties": {"matchLabels": LABELS},
            "required": ["matchLabels"],
        },
        "template": {
            "type": "object",
            "properties": {
                "metadata": {"type": "object", "properties": {"labels": LABELS}},
                "spec": {
                    "type": "object",
                    "properties": {
                        "containers": {"type": "array", "items": CONTAINER, "minItems": 1}
                    },
                    "required": ["containers"],
                },
            },
        },
        "strategy": {
            "type": "object",
            "properties": {
                "type": {"enum": ["RollingUpdate", "Recreate"]},
                "rollingUpdate": {
                    "type": "object",
                    "properties": {"maxSurge": QUANTITY, "maxUnavailable": QUANTITY},
                },
            },
        },
    },
    ["selector", "template"],
    "apps/v1",
)
DEP_OK = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "api", "namespace": "prod"},
    "spec": {
        "replicas": 3,
        "selector": {"matchLabels": {"app": "api"}},
        "template": {
            "metadata": {"labels": {"app": "api"}},
            "spec": {"containers": [{"name": "api", "image": "ghcr.io/acme/api:2.1"}]},
        },
        "strategy": {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": 1, "maxUnavailable": "25"},
        },
    },
}
add(
    "k8s/deployment",
    "kubernetes",
    DEPLOY,
    [DEP_OK],
    [
        setp(DEP_OK, "spec.replicas", -1),
        drop(DEP_OK, "spec.selector"),
        setp(DEP_OK, "kind", "Pod"),
        setp(DEP_OK, "spec.strategy.type", "BlueGreen"),
    ],
)
SVC = k8s(
    "Service",
    {
        "type": {"enum": ["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"]},
        "selector": LABELS,
        "ports": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "port": {"type": "integer", "minimum": 1, "maximum": 65535},
                    "targetPort": QUANTITY,
                    "nodePort": {"type": "integer", "minimum": 30000, "maximum": 32767},
                },
                "required": ["port"],
            },
        },
    },
)
SVC_OK = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {"name": "api"},
    "spec": {
        "type": "NodePort",
        "selector": {"app": "api"},
        "ports": [{"port": 80, "targetPort": 8080, "nodePort": 30080}],
    },
}
add(
    "k8s/service",
    "kubernetes",
    SVC,
    [SVC_OK],
    [setp(SVC_OK, "spec.ports.0.nodePort", 80), setp(SVC_OK, "spec.type", "Ingress")],
)
CM = k8s("ConfigMap", {})
CM["properties"]["data"] = {"type": "object", "additionalProperties": {"type": "string"}}
CM["properties"]["immutable"] = B
CM_OK = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "metadata": {"name": "cfg"},
    "data": {"LOG_LEVEL": "info", "app.yaml": "a: 1\n"},
}
add(
    "k8s/configmap",
    "kubernetes",
    CM,
    [CM_OK],
    [setp(CM_OK, "data.LOG_LEVEL", 3), drop(CM_OK, "metadata")],
)
SECRET = k8s("Secret", {})
SECRET["properties"]["type"] = S
SECRET["properties"]["data"] = {
    "type": "object",
    "additionalProperties": {"type": "string", "pattern": "^[A-Za-z0-9+/]*={0,2}$"},
}
SEC_OK = {
    "apiVersion": "v1",
    "kind": "Secret",
    "metadata": {"name": "db"},
    "type": "Opaque",
    "data": {"password": "cGFzc3dvcmQ="},
}
add("k8s/secret", "kubernetes", SECRET, [SEC_OK], [setp(SEC_OK, "data.password", "not base64!")])
CRON = k8s(
    "CronJob",
    {
        "schedule": {"type": "string", "pattern": "^(\\S+\\s+){4}\\S+$"},
        "concurrencyPolicy": {"enum": ["Allow", "Forbid", "Replace"]},
        "suspend": B,
        "successfulJobsHistoryLimit": {"type": "integer", "minimum": 0},
    },
    ["schedule"],
    "batch/v1",
)
CRON_OK = {
    "apiVersion": "batch/v1",
    "kind": "CronJob",
    "metadata": {"name": "nightly"},
    "spec": {"schedule": "0 3 * * *", "concurrencyPolicy": "Forbid", "suspend": False},
}
add(
    "k8s/cronjob",
    "kubernetes",
    CRON,
    [CRON_OK],
    [setp(CRON_OK, "spec.schedule", "daily"), setp(CRON_OK, "spec.concurrencyPolicy", "Sometimes")],
)
PVC = k8s(
    "PersistentVolumeClaim",
    {
        "accessModes": {
            "type": "array",
            "items": {"enum": ["ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany"]},
            "minItems": 1,
        },
        "storageClassName": S,
        "resources": {
            "type": "object",
            "properties": {
                "requests": {
                    "type": "object",
                    "properties": {"storage": QUANTITY},
                    "required": ["storage"],
                }
            },
        },
    },
    ["accessModes"],
)
PVC_OK = {
    "apiVersion": "v1",
    "kind": "PersistentVolumeClaim",
    "metadata": {"name": "data"},
    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}}},
}
add(
    "k8s/pvc",
    "kubernetes",
    PVC,
    [PVC_OK],
    [
        setp(PVC_OK, "spec.accessModes", []),
        setp(PVC_OK, "spec.resources.requests.storage", "ten gigs"),
    ],
)
INGRESS = k8s(
    "Ingress",
    {
        "ingressClassName": S,
        "rules": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "host": {
                        "type": "string",
                        "pattern": "^(\\*\\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
                    },
                    "http": {
                        "type": "object",
                        "properties": {
                            "paths": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "properties": {
                                        "path": {"type": "string", "pattern": "^/"},
                                        "pathType": {
                                            "enum": ["Exact", "Prefix", "ImplementationSpecific"]
                                        },
                                        "backend": {
                                            "type": "object",
                                            "properties": {
                                                "service": {
                                                    "type": "object",
                                                    "properties": {
                                                        "name": DNS,
                                                        "port": {
                                                            "type": "object",
                                                            "properties": {"number": INT},
                                                        },
                                                    },
                                                    "required": ["name"],
                                                }
                                            },
                                        },
                                    },
                                    "required": ["path", "pathType", "backend"],
                                },
                            }
                        },
                        "required": ["paths"],
                    },
                },
            },
        },
    },
    None,
    "networking.k8s.io/v1",
)
ING_OK = {
    "apiVersion": "networking.k8s.io/v1",
    "kind": "Ingress",
    "metadata": {"name": "web"},
    "spec": {
        "ingressClassName": "nginx",
        "rules": [
            {
                "host": "shop.example.com",
                "http": {
                    "paths": [
                        {
                            "path": "/",
                            "pathType": "Prefix",
                            "backend": {"service": {"name": "web", "port": {"number": 80}}},
                        }
                    ]
                },
            }
        ],
    },
}
add(
    "k8s/ingress",
    "kubernetes",
    INGRESS,
    [ING_OK],
    [
        setp(ING_OK, "spec.rules.0.host", "Shop Example"),
        setp(ING_OK, "spec.rules.0.http.paths.0.pathType", "Regex"),
        setp(ING_OK, "spec.rules.0.http.paths.0.path", "api"),
    ],
)
NS = k8s("Namespace", {"finalizers": {"type": "array", "items": S}})
NS["properties"]["status"] = {
    "type": "object",
    "properties": {"phase": {"enum": ["Active", "Terminating"]}},
    "readOnly": True,
}
NS_OK = {
    "apiVersion": "v1",
    "kind": "Namespace",
    "metadata": {"name": "team-a", "labels": {"owner": "a"}},
}
add(
    "k8s/namespace",
    "kubernetes",
    NS,
    [NS_OK, extra(NS_OK, "", "status", {"phase": "Active"})],
    [extra(NS_OK, "", "status", {"phase": "Gone"}), setp(NS_OK, "metadata.labels", ["owner"])],
)
add(
    "k8s/container-only",
    "kubernetes",
    CONTAINER,
    [
        C1,
        {
            "name": "sidecar",
            "image": "busybox",
            "command": ["sh", "-c"],
            "args": ["sleep 10"],
            "env": [{"name": "A", "value": "1"}],
            "imagePullPolicy": "Never",
        },
    ],
    [setp(C1, "image", ""), setp(C1, "imagePullPolicy", "Sometimes"), drop(C1, "image")],
)
add(
    "k8s/hpa",
    "kubernetes",
    k8s(
        "HorizontalPodAutoscaler",
        {
            "scaleTargetRef": {
                "type": "object",
                "properties": {"apiVersion": S, "kind": S, "name": S},
                "required": ["kind", "name"],
            },
            "minReplicas": {"type": "integer", "minimum": 1},
            "maxReplicas": {"type": "integer", "minimum": 1},
            "targetCPUUtilizationPercentage": {"type": "integer", "minimum": 1, "maximum": 100},
        },
        ["scaleTargetRef", "maxReplicas"],
        "autoscaling/v1",
    ),
    [
        {
            "apiVersion": "autoscaling/v1",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "api"},
            "spec": {
                "scaleTargetRef": {"kind": "Deployment", "name": "api"},
                "minReplicas": 2,
                "maxReplicas": 10,
                "targetCPUUtilizationPercentage": 70,
            },
        }
    ],
    [
        {
            "apiVersion": "autoscaling/v1",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "api"},
            "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "api"}, "maxReplicas": 0},
        },
        {
            "apiVersion": "autoscaling/v1",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "api"},
            "spec": {
                "scaleTargetRef": {"kind": "Deployment", "name": "api"},
                "maxReplicas": 3,
                "targetCPUUtilizationPercentage": 150,
            },
        },
    ],
)

# ---- 7. package.json-like and other config files ----------------------------------------------
DEP_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
PACKAGE = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "package manifest",
    "type": "object",
    "properties": {
        "name": {
            "type": "string",
            "maxLength": 214,
            "minLength": 1,
            "pattern": "^(@[a-z0-9-~][a-z0-9-._~]*/)?[a-z0-9-~][a-z0-9-._~]*$",
        },
        "version": {
            "type": "string",
            "pattern": "^[0-9]+\\.[0-9]+\\.[0-9]+(-[0-9A-Za-z.-]+)?(\\+[0-9A-Za-z.-]+)?$",
        },
        "description": {"type": "string", "description": "shown in search"},
        "keywords": {"type": "array", "items": S},
        "homepage": URI,
        "license": S,
        "author": {"anyOf": [S, open_obj({"name": S, "email": EMAIL, "url": URI}, ["name"])]},
        "main": S,
        "type": {"enum": ["commonjs", "module"], "default": "commonjs"},
        "scripts": {"type": "object", "additionalProperties": {"type": "string"}},
        "dependencies": DEP_MAP,
        "devDependencies": DEP_MAP,
        "engines": {"type": "object", "properties": {"node": S}},
        "private": B,
        "workspaces": {
            "anyOf": [
                {"type": "array", "items": S},
                open_obj({"packages": {"type": "array", "items": S}}),
            ]
        },
    },
    "required": ["name", "version"],
}
PKG = {
    "name": "@acme/widgets",
    "version": "1.4.0",
    "description": "Widgets for everyone",
    "keywords": ["ui", "widgets"],
    "license": "MIT",
    "author": {"name": "Acme", "email": "dev@acme.io"},
    "main": "dist/index.js",
    "type": "module",
    "scripts": {"build": "tsc -p .", "test": "vitest run"},
    "dependencies": {"react": "^18.2.0"},
    "devDependencies": {"typescript": "~5.4.0"},
    "engines": {"node": ">=18"},
}
add(
    "config/package-json",
    "package.json",
    PACKAGE,
    [
        PKG,
        {
            "name": "tiny",
            "version": "0.0.1",
            "author": "Me <me@x.io>",
            "private": True,
            "workspaces": ["packages/*"],
        },
    ],
    [
        setp(PKG, "name", "Acme Widgets"),
        setp(PKG, "version", "1.4"),
        setp(PKG, "type", "esm"),
        setp(PKG, "dependencies.react", 18),
        setp(PKG, "author", {"email": "x@y.z"}),
    ],
)
add(
    "config/tsconfig-like",
    "package.json",
    open_obj(
        {
            "extends": S,
            "compilerOptions": open_obj(
                {
                    "target": {"enum": ["es5", "es2015", "es2020", "es2022", "esnext"]},
                    "module": {"enum": ["commonjs", "esnext", "nodenext", "node16"]},
                    "strict": B,
                    "outDir": S,
                    "paths": {
                        "type": "object",
                        "additionalProperties": {"type": "array", "items": S},
                    },
                    "lib": {"type": "array", "items": S},
                }
            ),
            "include": {"type": "array", "items": S},
            "exclude": {"type": "array", "items": S},
        }
    ),
    [
        {
            "compilerOptions": {
                "target": "es2022",
                "module": "nodenext",
                "strict": True,
                "outDir": "dist",
                "paths": {"@/*": ["src/*"]},
            },
            "include": ["src"],
        }
    ],
    [
        {"compilerOptions": {"target": "es3"}},
        {"compilerOptions": {"strict": "true"}},
        {"include": "src"},
    ],
)
add(
    "config/eslint-like",
    "package.json",
    open_obj(
        {
            "root": B,
            "env": {"type": "object", "additionalProperties": B},
            "extends": {"anyOf": [S, {"type": "array", "items": S}]},
            "rules": {
                "type": "object",
                "additionalProperties": {
                    "anyOf": [
                        {"enum": ["off", "warn", "error", 0, 1, 2]},
                        {
                            "type": "array",
                            "minItems": 1,
                            "prefixItems": [{"enum": ["off", "warn", "error", 0, 1, 2]}],
                        },
                    ]
                },
            },
        }
    ),
    [
        {
            "root": True,
            "env": {"browser": True},
            "extends": ["eslint:recommended"],
            "rules": {"semi": ["error", "always"], "no-console": "warn", "eqeqeq": 2},
        }
    ],
    [{"rules": {"semi": "sometimes"}}, {"env": {"browser": "yes"}}, {"rules": {"semi": []}}],
)
add(
    "config/compose-like",
    "package.json",
    open_obj(
        {
            "version": S,
            "services": {
                "type": "object",
                "additionalProperties": open_obj(
                    {
                        "image": S,
                        "build": {"anyOf": [S, open_obj({"context": S, "dockerfile": S})]},
                        "ports": {
                            "type": "array",
                            "items": {
                                "anyOf": [{"type": "string", "pattern": "^[0-9]+(:[0-9]+)?$"}, INT]
                            },
                        },
                        "environment": {
                            "anyOf": [
                                {
                                    "type": "object",
                                    "additionalProperties": {
                                        "type": ["string", "number", "boolean", "null"]
                                    },
                                },
                                {"type": "array", "items": S},
                            ]
                        },
                        "depends_on": {"type": "array", "items": S},
                        "restart": {"enum": ["no", "always", "on-failure", "unless-stopped"]},
                    }
                ),
            },
        },
        ["services"],
    ),
    [
        {
            "services": {
                "db": {
                    "image": "postgres:16",
                    "environment": {"POSTGRES_PASSWORD": "x"},
                    "restart": "always",
                },
                "web": {"build": ".", "ports": ["8000:8000"], "depends_on": ["db"]},
            }
        }
    ],
    [
        {"services": {"db": {"restart": "sometimes"}}},
        {"services": {"web": {"ports": ["eighty"]}}},
        {},
    ],
)
add(
    "config/workflow-like",
    "package.json",
    open_obj(
        {
            "name": S,
            "on": {"anyOf": [S, {"type": "array", "items": S}, {"type": "object"}]},
            "jobs": {
                "type": "object",
                "additionalProperties": open_obj(
                    {
                        "runs-on": {"anyOf": [S, {"type": "array", "items": S}]},
                        "timeout-minutes": {"type": "integer", "minimum": 1},
                        "steps": {
                            "type": "array",
                            "minItems": 1,
                            "items": open_obj(
                                {"name": S, "uses": S, "run": S, "with": {"type": "object"}}
                            ),
                        },
                    },
                    ["runs-on", "steps"],
                ),
            },
        },
        ["on", "jobs"],
    ),
    [
        {
            "name": "CI",
            "on": ["push", "pull_request"],
            "jobs": {
                "test": {
                    "runs-on": "ubuntu-latest",
                    "steps": [{"uses": "actions/checkout@v4"}, {"run": "make test"}],
                }
            },
        }
    ],
    [
        {"on": "push", "jobs": {"test": {"runs-on": "ubuntu-latest", "steps": []}}},
        {"on": "push", "jobs": {"test": {"steps": [{"run": "x"}]}}},
        {"on": 3, "jobs": {}},
    ],
)
add(
    "config/pyproject-like",
    "package.json",
    open_obj(
        {
            "project": open_obj(
                {
                    "name": {
                        "type": "string",
                        "pattern": "^([A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9._-]*[A-Za-z0-9])$",
                    },
                    "version": S,
                    "requires-python": S,
                    "dependencies": {"type": "array", "items": S},
                    "optional-dependencies": {
                        "type": "object",
                        "additionalProperties": {"type": "array", "items": S},
                    },
                    "authors": {"type": "array", "items": open_obj({"name": S, "email": EMAIL})},
                },
                ["name"],
            ),
            "tool": {"type": "object"},
        }
    ),
    [
        {
            "project": {
                "name": "lm-tools",
                "version": "0.1.0",
                "requires-python": ">=3.10",
                "dependencies": ["numpy>=1.26"],
                "authors": [{"name": "A", "email": "a@b.io"}],
            },
            "tool": {"ruff": {"line-length": 100}},
        }
    ],
    [
        {"project": {"name": "-bad-"}},
        {"project": {"version": "1"}},
        {"project": {"name": "ok", "dependencies": "numpy"}},
    ],
)
add(
    "config/prettier-like",
    "package.json",
    {
        "type": "object",
        "properties": {
            "printWidth": {"type": "integer", "minimum": 40, "maximum": 200, "default": 80},
            "tabWidth": {"type": "integer", "minimum": 1, "maximum": 8},
            "semi": B,
            "singleQuote": B,
            "trailingComma": {"enum": ["all", "es5", "none"]},
            "endOfLine": {"enum": ["lf", "crlf", "cr", "auto"]},
        },
        "additionalProperties": False,
    },
    [{"printWidth": 100, "semi": False, "singleQuote": True, "trailingComma": "all"}, {}],
    [{"printWidth": 20}, {"trailingComma": "some"}, {"useTabs": True}],
)
add(
    "config/cargo-like",
    "package.json",
    open_obj(
        {
            "package": open_obj(
                {
                    "name": {"type": "string", "pattern": "^[a-zA-Z][a-zA-Z0-9_-]*$"},
                    "version": {"type": "string", "pattern": "^[0-9]+\\.[0-9]+\\.[0-9]+$"},
                    "edition": {"enum": ["2015", "2018", "2021", "2024"]},
                },
                ["name", "version"],
            ),
            "dependencies": {
                "type": "object",
                "additionalProperties": {
                    "anyOf": [
                        S,
                        open_obj(
                            {"version": S, "features": {"type": "array", "items": S}, "optional": B}
                        ),
                    ]
                },
            },
        },
        ["package"],
    ),
    [
        {
            "package": {"name": "fastjson", "version": "0.3.1", "edition": "2021"},
            "dependencies": {"serde": {"version": "1", "features": ["derive"]}, "regex": "1.10"},
        }
    ],
    [
        {"package": {"name": "fastjson", "version": "0.3", "edition": "2021"}},
        {"package": {"name": "x", "version": "1.0.0", "edition": "2019"}},
        {"package": {"name": "x", "version": "1.0.0"}, "dependencies": {"serde": 1}},
    ],
)
add(
    "config/openapi-info",
    "package.json",
    open_obj(
        {
            "openapi": {"type": "string", "pattern": "^3\\.[01]\\.[0-9]+$"},
            "info": open_obj(
                {
                    "title": S,
                    "version": S,
                    "contact": open_obj({"name": S, "email": EMAIL, "url": URI}),
                    "license": open_obj({"name": S, "url": URI}, ["name"]),
                },
                ["title", "version"],
            ),
            "servers": {"type": "array", "items": open_obj({"url": S, "description": S}, ["url"])},
        },
        ["openapi", "info"],
        patternProperties={"^x-": {}},
    ),
    [
        {
            "openapi": "3.1.0",
            "info": {"title": "Pets", "version": "1.0", "license": {"name": "MIT"}},
            "servers": [{"url": "https://api.pets.io"}],
        }
    ],
    [
        {"openapi": "2.0", "info": {"title": "Pets", "version": "1"}},
        {"openapi": "3.0.3", "info": {"title": "Pets"}},
        {"openapi": "3.0.3", "info": {"title": "P", "version": "1", "license": {}}},
    ],
)
add(
    "config/renovate-like",
    "package.json",
    open_obj(
        {
            "extends": {"type": "array", "items": S},
            "schedule": {"type": "array", "items": S},
            "automerge": B,
            "packageRules": {
                "type": "array",
                "items": open_obj(
                    {
                        "matchPackageNames": {"type": "array", "items": S},
                        "matchUpdateTypes": {
                            "type": "array",
                            "items": {"enum": ["major", "minor", "patch", "pin", "digest"]},
                        },
                        "automerge": B,
                        "groupName": S,
                    }
                ),
            },
            "prConcurrentLimit": {"type": "integer", "minimum": 0},
        }
    ),
    [
        {
            "extends": ["config:recommended"],
            "automerge": False,
            "packageRules": [
                {
                    "matchUpdateTypes": ["minor", "patch"],
                    "automerge": True,
                    "groupName": "non-major",
                }
            ],
            "prConcurrentLimit": 5,
        }
    ],
    [
        {"packageRules": [{"matchUpdateTypes": ["huge"]}]},
        {"prConcurrentLimit": -1},
        {"extends": "config:recommended"},
    ],
)

# ---- 8. draft-04 / draft-07 spellings and annotation keywords ---------------------------------
DRAFT4 = "http://json-schema.org/draft-04/schema#"
DRAFT7 = "http://json-schema.org/draft-07/schema#"
add(
    "draft04/product",
    "draft-04",
    {
        "$schema": DRAFT4,
        "id": "http://example.com/product.json",
        "title": "Product",
        "type": "object",
        "definitions": {
            "price": {"type": "number", "minimum": 0, "exclusiveMinimum": True},
            "dimensions": {
                "type": "object",
                "properties": {"length": N, "width": N, "height": N},
                "required": ["length", "width", "height"],
            },
        },
        "properties": {
            "id": {"type": "integer", "description": "The unique identifier"},
            "name": S,
            "price": {"$ref": "#/definitions/price"},
            "tags": {"type": "array", "items": S, "minItems": 1, "uniqueItems": True},
            "dimensions": {"$ref": "#/definitions/dimensions"},
        },
        "required": ["id", "name", "price"],
    },
    [
        {
            "id": 1,
            "name": "Desk",
            "price": 99.5,
            "tags": ["home"],
            "dimensions": {"length": 1, "width": 2, "height": 3},
        }
    ],
    [
        {"id": 1, "name": "Desk", "price": 0},
        {"id": 1, "name": "Desk", "price": 5, "dimensions": {"length": 1}},
        {"id": 1, "name": "Desk", "price": 5, "tags": []},
    ],
)
add(
    "draft04/address-id",
    "draft-04",
    {
        "$schema": DRAFT4,
        "id": "urn:example:address",
        "description": "An address (draft-04, with id)",
        "type": "object",
        "properties": {
            "street_address": S,
            "locality": S,
            "region": S,
            "postal_code": S,
            "country_name": S,
        },
        "required": ["locality", "region", "country_name"],
    },
    [{"street_address": "1 Rue X", "locality": "Lyon", "region": "ARA", "country_name": "France"}],
    [
        {"locality": "Lyon", "region": "ARA"},
        {"locality": 1, "region": "ARA", "country_name": "France"},
    ],
)
add(
    "draft04/exclusive-max",
    "draft-04",
    {
        "$schema": DRAFT4,
        "type": "object",
        "properties": {
            "ratio": {"type": "number", "minimum": 0, "maximum": 1, "exclusiveMaximum": True},
            "count": {"type": "integer", "minimum": 0},
        },
        "required": ["ratio"],
    },
    [{"ratio": 0}, {"ratio": 0.999, "count": 3}],
    [{"ratio": 1}, {"ratio": -0.5}, {"ratio": 0.5, "count": -1}],
)
add(
    "draft04/tree-definitions",
    "draft-04",
    {
        "$schema": DRAFT4,
        "id": "tree",
        "definitions": {
            "leaf": {
                "type": "object",
                "properties": {"value": INT},
                "required": ["value"],
                "additionalProperties": False,
            }
        },
        "type": "object",
        "properties": {
            "root": {"$ref": "#/definitions/leaf"},
            "children": {"type": "array", "items": {"$ref": "#/definitions/leaf"}, "maxItems": 4},
        },
        "required": ["root"],
    },
    [{"root": {"value": 1}, "children": [{"value": 2}, {"value": 3}]}],
    [
        {"root": {"value": 1, "extra": 2}},
        {"root": {"value": "1"}},
        {"root": {"value": 1}, "children": [{}]},
    ],
)
add(
    "draft04/enum-and-items-array",
    "draft-04",
    {
        "$schema": DRAFT4,
        "type": "array",
        "items": [{"type": "string"}, {"enum": ["a", "b"]}],
        "additionalItems": False,
    },
    [["x", "a"], ["x"]],
    [["x", "c"], ["x", "a", "extra"], [1]],
)
add(
    "draft04/legacy-api-response",
    "draft-04",
    {
        "$schema": DRAFT4,
        "id": "http://api.example.com/schemas/response#",
        "type": "object",
        "definitions": {
            "error": {
                "type": "object",
                "properties": {"code": {"type": "integer"}, "message": {"type": "string"}},
                "required": ["code", "message"],
            },
            "user": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer"},
                    "login": {"type": "string", "pattern": "^[a-z0-9_]{3,16}$"},
                },
                "required": ["id", "login"],
            },
        },
        "properties": {
            "ok": {"type": "boolean"},
            "data": {"type": "array", "items": {"$ref": "#/definitions/user"}},
            "error": {"$ref": "#/definitions/error"},
        },
        "required": ["ok"],
    },
    [
        {"ok": True, "data": [{"id": 1, "login": "ada_l"}]},
        {"ok": False, "error": {"code": 404, "message": "not found"}},
    ],
    [
        {"ok": True, "data": [{"id": 1, "login": "A"}]},
        {"ok": False, "error": {"code": "404"}},
        {"data": []},
    ],
)
add(
    "draft07/config-definitions",
    "draft-07",
    {
        "$schema": DRAFT7,
        "$id": "https://example.com/app-config.schema.json",
        "definitions": {"level": {"type": "string", "enum": ["debug", "info", "warning", "error"]}},
        "type": "object",
        "properties": {
            "logLevel": {"$ref": "#/definitions/level"},
            "port": {"type": "integer", "minimum": 1024, "maximum": 65535},
            "features": {"type": "object", "additionalProperties": {"type": "boolean"}},
        },
        "required": ["port"],
        "dependencies": {"tls_cert": ["tls_key"]},
    },
    [{"logLevel": "info", "port": 8443, "features": {"beta": True}}],
    [
        {"logLevel": "verbose", "port": 8443},
        {"port": 80},
        {"port": 8443, "features": {"beta": "on"}},
    ],
)
add(
    "draft07/exclusive-numeric",
    "draft-07",
    {
        "$schema": DRAFT7,
        "type": "object",
        "properties": {
            "temp_k": {"type": "number", "exclusiveMinimum": 0},
            "pct": {"type": "integer", "minimum": 0, "exclusiveMaximum": 101},
        },
    },
    [{"temp_k": 273.15, "pct": 100}],
    [{"temp_k": 0}, {"pct": 101}],
)
add(
    "annotations/vendor-keywords",
    "annotations",
    {
        "type": "object",
        "title": "Widget",
        "description": "A widget as a UI builder stores it",
        "$comment": "generated",
        "x-order": 3,
        "x-display-name": "Widget",
        "examples": [{"label": "OK", "width": 10}],
        "properties": {
            "label": {
                "type": "string",
                "title": "Label",
                "readonly": False,
                "sortIndex": 1,
                "x-ui-widget": "text",
            },
            "width": {
                "type": "integer",
                "minimum": 1,
                "default": 10,
                "deprecated": False,
                "readOnly": False,
                "x-unit": "px",
            },
            "id": {"type": "string", "format": "uuid", "readOnly": True, "writeOnly": False},
        },
        "required": ["label"],
    },
    [
        {"label": "OK", "width": 10},
        {"label": "Cancel", "id": "00000000-0000-4000-8000-000000000000"},
    ],
    [{"width": 10}, {"label": "OK", "width": 0}, {"label": "OK", "id": "zero"}],
)
add(
    "annotations/content-keywords",
    "annotations",
    {
        "type": "object",
        "properties": {
            "avatar": {
                "type": "string",
                "contentEncoding": "base64",
                "contentMediaType": "image/png",
                "maxLength": 64,
            },
            "bio": {"type": "string", "description": "markdown", "examples": ["Hi!"]},
        },
        "required": ["bio"],
    },
    [{"avatar": "iVBORw0KGgo=", "bio": "Hi!"}],
    [{"avatar": 3, "bio": "x"}, {"avatar": "x"}],
)
add(
    "annotations/k8s-crd-vendor",
    "annotations",
    {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
        "properties": {
            "spec": {
                "type": "object",
                "x-kubernetes-validations": [{"rule": "self.replicas >= 0"}],
                "properties": {
                    "replicas": {
                        "type": "integer",
                        "minimum": 0,
                        "x-kubernetes-int-or-string": False,
                    },
                    "tags": {"type": "array", "items": S, "x-kubernetes-list-type": "set"},
                },
                "required": ["replicas"],
            }
        },
    },
    [{"spec": {"replicas": 2, "tags": ["a"]}, "status": {"anything": [1, 2]}}],
    [{"spec": {"replicas": -1}}, {"spec": {"tags": []}}],
)

# ---- 9. pydantic-style models (titles everywhere, $defs, anyOf-null optionals) ----------------


def pyd(title: str, props: dict, required: list, defs: dict | None = None) -> dict:
    out = {
        "title": title,
        "type": "object",
        "properties": {k: {"title": k.replace("_", " ").title(), **v} for k, v in props.items()},
        "required": required,
    }
    if defs:
        out["$defs"] = defs
    return out


OPT_STR = {"anyOf": [S, {"type": "null"}], "default": None}
add(
    "pydantic/user",
    "pydantic",
    pyd(
        "User",
        {
            "id": INT,
            "name": S,
            "email": EMAIL,
            "role": {"$ref": "#/$defs/Role"},
            "nickname": OPT_STR,
            "signup": DATETIME,
        },
        ["id", "name", "email", "role", "signup"],
        {"Role": {"title": "Role", "enum": ["admin", "editor", "viewer"], "type": "string"}},
    ),
    [
        {
            "id": 1,
            "name": "Ann",
            "email": "ann@x.io",
            "role": "editor",
            "nickname": None,
            "signup": "2024-04-04T04:04:04Z",
        }
    ],
    [
        {
            "id": 1,
            "name": "Ann",
            "email": "ann@x.io",
            "role": "owner",
            "signup": "2024-04-04T04:04:04Z",
        },
        {
            "id": 1,
            "name": "Ann",
            "email": "ann@x.io",
            "role": "editor",
            "nickname": 3,
            "signup": "2024-04-04T04:04:04Z",
        },
        {"id": 1, "name": "Ann", "email": "ann@x.io", "role": "editor"},
    ],
)
add(
    "pydantic/extraction",
    "pydantic",
    pyd(
        "Extraction",
        {
            "company": S,
            "founded": {"anyOf": [INT, {"type": "null"}], "default": None},
            "people": {"type": "array", "items": {"$ref": "#/$defs/Person"}},
            "headquarters": {"anyOf": [{"$ref": "#/$defs/Place"}, {"type": "null"}]},
        },
        ["company", "people", "headquarters"],
        {
            "Person": pyd("Person", {"name": S, "title": OPT_STR}, ["name"]),
            "Place": pyd("Place", {"city": S, "country": S}, ["city", "country"]),
        },
    ),
    [
        {
            "company": "Acme",
            "founded": 1999,
            "people": [{"name": "Wile E.", "title": "CEO"}],
            "headquarters": {"city": "Phoenix", "country": "US"},
        },
        {"company": "X", "people": [], "headquarters": None},
    ],
    [
        {"company": "Acme", "people": [{"title": "CEO"}], "headquarters": None},
        {"company": "Acme", "founded": "1999", "people": [], "headquarters": None},
        {"company": "Acme", "people": []},
    ],
)
add(
    "pydantic/quiz",
    "pydantic",
    pyd(
        "Quiz",
        {
            "topic": S,
            "questions": {
                "type": "array",
                "items": {"$ref": "#/$defs/Question"},
                "minItems": 1,
                "maxItems": 5,
            },
        },
        ["topic", "questions"],
        {
            "Question": pyd(
                "Question",
                {
                    "text": S,
                    "options": {"type": "array", "items": S, "minItems": 2, "maxItems": 4},
                    "answer_index": {"type": "integer", "minimum": 0, "maximum": 3},
                },
                ["text", "options", "answer_index"],
            )
        },
    ),
    [
        {
            "topic": "space",
            "questions": [
                {"text": "Largest planet?", "options": ["Mars", "Jupiter"], "answer_index": 1}
            ],
        }
    ],
    [
        {"topic": "space", "questions": []},
        {"topic": "space", "questions": [{"text": "Q", "options": ["a"], "answer_index": 0}]},
        {"topic": "s", "questions": [{"text": "Q", "options": ["a", "b"], "answer_index": 4}]},
    ],
)
add(
    "pydantic/literal-status",
    "pydantic",
    pyd(
        "Status",
        {
            "state": {"enum": ["queued", "running", "done", "failed"], "type": "string"},
            "progress": {"type": "number", "minimum": 0, "maximum": 1},
            "error": OPT_STR,
        },
        ["state", "progress"],
    ),
    [{"state": "running", "progress": 0.25}, {"state": "failed", "progress": 1, "error": "OOM"}],
    [{"state": "paused", "progress": 0.1}, {"state": "done", "progress": 2}],
)

# ---- 10. larger composed documents (programmatic families) -------------------------------------
FIELD_KINDS = [
    ("str", S, "text", 5),
    ("int", {"type": "integer", "minimum": 0}, 3, -3),
    ("num", N, 2.5, "2.5"),
    ("bool", B, True, "true"),
    ("date", DATE, "2023-03-03", "03/03/2023"),
    ("email", EMAIL, "x@y.org", "x.y.org"),
    ("enum", {"enum": ["a", "b", "c"]}, "b", "d"),
    ("uuid", UUID, "9f8e7d6c-5b4a-4321-8fed-cba987654321", "9f8e"),
    ("opt", {"type": ["string", "null"]}, None, 0),
    ("arr", {"type": "array", "items": INT, "maxItems": 3}, [1, 2], [1, 2, 3, 4]),
]
for width in (3, 6, 10, 16):
    for closed in (False, True):
        props, good = {}, {}
        for i in range(width):
            kind, sch, ok, _ = FIELD_KINDS[(i * 7 + width) % len(FIELD_KINDS)]
            props[f"{kind}_{i}"] = sch
            good[f"{kind}_{i}"] = ok
        required = list(props)[: max(1, width // 2)]
        schema = open_obj(props, required)
        if closed:
            schema["additionalProperties"] = False
        bads = []
        for i in (0, width - 1):
            kind, _, _, bad = FIELD_KINDS[(i * 7 + width) % len(FIELD_KINDS)]
            bads.append(setp(good, f"{kind}_{i}", bad))
        bads.append(drop(good, required[0]))
        if closed:
            bads.append(extra(good, "", "unexpected", 1))
        add(
            f"generated/flat-{width}{'-closed' if closed else ''}",
            "generated",
            schema,
            [good],
            bads,
        )

for depth in (2, 3, 4):
    schema: dict = {"type": "object", "properties": {"value": INT}, "required": ["value"]}
    good: dict = {"value": depth}
    for level in range(depth):
        schema = {
            "type": "object",
            "properties": {"name": S, f"level{level}": schema},
            "required": [f"level{level}"],
        }
        good = {"name": f"n{level}", f"level{level}": good}
    path = ".".join(f"level{lv}" for lv in reversed(range(depth))) + ".value"
    add(
        f"generated/nested-{depth}",
        "generated",
        schema,
        [good],
        [setp(good, path, "x"), drop(good, path)],
    )


# ---- 11. JSON-Schema-Store-like configuration files (bench/schema_corpus_store.py) -------------
for _entry in STORE:
    add(*_entry)


# ---- checking ----------------------------------------------------------------------------------
_RFC3339 = re.compile(
    r"^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])[Tt]([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)"
    r"(\.\d+)?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d)$"
)
_TIME = re.compile(
    r"^([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d)$"
)
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:[^\s]*$")


def format_checker() -> Any:
    """jsonschema's format checker, with date-time, time and uri asserted (jsonschema checks
    them only when optional packages are installed)."""
    import datetime

    import jsonschema

    checker = jsonschema.FormatChecker()

    @checker.checks("date-time")
    def _date_time(value: object) -> bool:
        if not isinstance(value, str):
            return True
        if not _RFC3339.match(value):
            return False
        datetime.date.fromisoformat(value[:10])  # raises on 2024-02-30
        return True

    @checker.checks("time")
    def _time(value: object) -> bool:
        return not isinstance(value, str) or bool(_TIME.match(value))

    @checker.checks("uri")
    def _uri(value: object) -> bool:
        return not isinstance(value, str) or bool(_URI.match(value))

    # jsonschema raises ValueError from date.fromisoformat: count it as "does not conform".
    checker.checkers["date-time"] = (_date_time, (ValueError,))
    return checker


def check_corpus(corpus: list[Entry] = CORPUS) -> None:
    """AssertionError unless every valid instance validates and every invalid one does not
    (jsonschema, the schema's own draft, formats asserted) and names are unique."""
    import jsonschema

    checker = format_checker()
    names = [e.name for e in corpus]
    assert len(names) == len(set(names)), "duplicate names"
    for e in corpus:
        assert e.valid and e.invalid, e.name
        cls = jsonschema.validators.validator_for(e.schema, default=jsonschema.Draft202012Validator)
        cls.check_schema(e.schema)
        v = cls(e.schema, format_checker=checker)
        for x in e.valid:
            errors = list(v.iter_errors(x))
            assert not errors, (
                f"{e.name}: valid instance rejected: {json.dumps(x)[:80]}: {errors[0].message}"
            )
        for x in e.invalid:
            assert not v.is_valid(x), f"{e.name}: invalid instance accepted: {json.dumps(x)[:120]}"


def summary(entries) -> str:
    """One line: how many schemas and instances, schemas by kind."""
    kinds: dict[str, int] = {}
    for e in entries:
        kinds[e.kind] = kinds.get(e.kind, 0) + 1
    return (
        f"{len(entries)} schemas, {sum(len(e.valid) for e in entries)} valid and "
        f"{sum(len(e.invalid) for e in entries)} invalid instances: "
        + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()))
    )


if __name__ == "__main__":
    check_corpus()
    print(summary(CORPUS))
