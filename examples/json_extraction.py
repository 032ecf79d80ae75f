"""JSON extraction with a schema (a pydantic model): the output always validates."""

import json

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
        "Sold out: the red umbrella, 12 dollars.",
    ]
    for st in extract.run_batch([{"text": t} for t in texts], temperature=0):
        product = Product.model_validate(json.loads(st["product"]))
        print(product)
