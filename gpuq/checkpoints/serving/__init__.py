"""Model folders in the formats serving engines load: compressed-tensors and fine-grained fp8.

``gpuq quantize MODEL_DIR -o OUT_DIR --format compressed-tensors | fp8-blocks`` writes them,
``gpuq dequantize MODEL_DIR -o OUT_DIR`` reads them (and gpuq's own files in a model folder)
back to a dense folder. What each format holds, and which line of which library says so:
``docs/serving-formats.md``.

* :mod:`.folder`: a model folder (``config.json``, ``model.safetensors`` or shards and
  their index, other files copied as they are) read and written, all or nothing;
* :mod:`.packing`: compressed-tensors' int32 words of offset-binary codes;
* :mod:`.formats`: what every format's per-weight storage shares (the scheme of one Linear
  weight, the :class:`~.formats.Layout` a format subclasses); each format's own layouts, its
  ``quantization_config`` and the reading of it live in its module in
  :mod:`gpuq.checkpoints.formats`, which hands them to the two commands' work below;
* :mod:`.selection`: which weights are quantized, the ``ignore`` rule, vLLM's shape rules;
* :mod:`.quantize` and :mod:`.dequantize`: the two commands' work, shard by shard.

May import: :mod:`gpuq`'s public API and the rest of :mod:`gpuq.checkpoints` (files, the
all-or-nothing output folder, the report, the selection globs, device choice).
"""
