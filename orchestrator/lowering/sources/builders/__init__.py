"""The build side of the model sources (torch): each source's builder, loading its module and making its inputs.

Imported on a cache miss only, by the `module:object` path a source names (`spec.ModelSource.builder`).
"""
