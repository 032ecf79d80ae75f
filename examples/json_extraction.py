"""JSON extraction with a schema (a pydantic model): the output always validates.

`state["product"]` is the generated JSON text; `state.parsed("product", Product)` is that
text parsed into a `Product` instance (typed `Product` for a type checker; lp.ConstraintError
if it was cut short at max_tokens). Streamed, `state.partial_iter("product")` gives the
fields written so far as the model writes them.
"""

from pydantic import BaseModel, Field

import lmprog as lp


class Product(BaseModel):
    name: str = Field(max_length=30)
    price: float
    in_stock: bool


@lp.function
def extract(s, text):
    s += lp.user(f"Extract the product as JSON with keys name, price, in_stock.\nText: {text}")
    s += lp.assistant(lp.gen("product", json_schema=Product, max_tokens=64))


if __name__ == "__main__":
    texts = [
        "The blue kettle costs 24.99 and ships today.",
        "The red umbrella costs 12 dollars. It is not in stock.",
    ]
    for text, st in zip(texts, extract.run_batch([{"text": t} for t in texts], temperature=0)):
        product = st.parsed("product", Product)  # a Product (checked)
        print(f"{text}\n  text:   {st['product']}\n  parsed: {product!r}")
    state = extract.run(text=texts[0], temperature=0, stream=True)
    for fields in state.partial_iter("product"):  # a number once it ends, a string once closed
        print("  so far:", fields)
