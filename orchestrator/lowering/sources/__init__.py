"""The model sources, one module each: where a spec's model comes from (a spec file's `source`).

Each module here is the spec side of one source (no torch): it registers a `spec.ModelSource` (its fields and their
checks, refused keys, pretrained lookup, defaults, identity) that names its build side (loading the module, example
inputs, calibration inputs; torch imported on a cache miss only). spec.SOURCES finds every module of this folder,
so a new source is one file here, or a `register_source` call of one's own (a test, a plugin).
"""
