"""ONNX graph helpers every stage uses: queries on a graph's nodes and values, the PyTorch module each node came
from, and writing a graph to disk one piece at a time."""
