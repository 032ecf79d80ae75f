"""The engine: the loop that serves a runtime's requests and what surrounds it. engine.py
the loop, io.py what goes in and comes back, step_outputs.py one step's logits turned into
results, metrics.py its counters, launch.py assembling it around a model."""
