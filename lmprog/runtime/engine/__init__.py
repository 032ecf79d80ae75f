"""The engine: the loop that serves a runtime's requests (engine.py), what goes in and comes
back (io.py), one step's logits turned into results (step_outputs.py), its counters
(metrics.py), and assembling it around a model (launch.py)."""
