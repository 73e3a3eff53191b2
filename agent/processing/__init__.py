"""Frames -> tensors (preprocess) and tensors -> plain dicts (postprocess).

Backends only move tensors; every model family's decoding lives here, once.
"""

from agent.processing.postprocess import Postprocessor, build_postprocessor
from agent.processing.preprocess import Geometry, Preprocessor

__all__ = ["Geometry", "Postprocessor", "Preprocessor", "build_postprocessor"]
