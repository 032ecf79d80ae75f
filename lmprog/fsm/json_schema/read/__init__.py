"""Reading a schema document into terms: drafts, references, keywords, facets, the builder."""
