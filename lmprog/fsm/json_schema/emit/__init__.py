"""Terms to a grammar: the Lark fragments, and the emitter of numbers, strings, arrays and
objects."""
