"""`edge-agent infer MODEL INPUT`: one input through a model as a pipeline would process it
(run.py), its input read (inputs.py), the model, settings and backend chosen (choice.py), and
the result drawn (draw.py); with --track every frame of a video, its boxes tracked and the events
and a summary given (track.py)."""
