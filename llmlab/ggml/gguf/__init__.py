"""GGUF, llama.cpp's model file format: reader, writer, dump."""
from .constants import GGUFError, ValueType, GGUF_MAGIC, DEFAULT_ALIGNMENT
from .meta import Metadata, MetadataError
from .reader import GGUFFile, KVField, Span, StringArray, TensorInfo
from .writer import GGUFWriter

__all__ = ["GGUFFile", "GGUFWriter", "GGUFError", "ValueType", "KVField", "Span", "StringArray",
           "TensorInfo", "Metadata", "MetadataError", "GGUF_MAGIC", "DEFAULT_ALIGNMENT"]
