"""`edge-agent infer MODEL INPUT`: one input through a model as a pipeline would process it
(run.py), its input read (inputs.py), the model, settings and backend chosen (choice.py), and
the result drawn (draw.py)."""
