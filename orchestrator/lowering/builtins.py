"""The built-in model specs: the models `fab lower --model NAME` knows without a spec file (`fab models` lists them).

Each is a ModelSpec as a spec file would give it (spec.py checks those); the tiny ones (random weights, sizes in
the name) are what the tests and quick demos lower. `resolve_spec` gives a built-in by name or a spec file's.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.config import did_you_mean
from orchestrator.errors import SpecError
from orchestrator.lowering.sources.huggingface import HuggingFaceOptions
from orchestrator.lowering.sources.timm import TimmOptions
from orchestrator.lowering.sources.torchvision import TorchvisionOptions
from orchestrator.lowering.spec import (
    GENERATION_OUTPUT,
    GENERATION_TASK,
    IMAGE_TASK,
    SOURCES,
    InputSpec,
    ModelSpec,
    UnknownModel,
    load_spec_file,
)

_MOBILENET_V2_TINY = {"width_mult": 0.25, "num_classes": 10}
_RESNET_18_TINY = {"num_classes": 10}  # BasicBlock is fixed at width 64: small by its input only
_TEST_EFFICIENTNET_TINY = {"num_classes": 10}  # timm's own test-sized EfficientNet: 0.1M parameters
_DISTILBERT_TINY = {"vocab_size": 1000, "dim": 64, "n_layers": 2, "n_heads": 2, "hidden_dim": 128}
_GPT2_TINY = {"vocab_size": 1000, "n_embd": 64, "n_layer": 2, "n_head": 2, "n_positions": 128}
# Wider random weights than GPT-2's own 0.02, or greedy decoding of a tiny random GPT-2 repeats one token forever.
_GPT2_GEN_TINY = {**_GPT2_TINY, "initializer_range": 0.2}
_BERT_TINY = {"vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
              "intermediate_size": 128, "max_position_embeddings": 128}  # fmt: skip
_VIT_TINY = {"image_size": 32, "patch_size": 8, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
             "intermediate_size": 128, "num_labels": 10}  # fmt: skip
# Whisper's encoder takes exactly 2 x max_source_positions log-mel frames: 100 here (1 s), 3000 (30 s) for the real one.
_WHISPER_TINY = {"vocab_size": 1000, "d_model": 64, "encoder_layers": 2, "encoder_attention_heads": 2,
                 "decoder_layers": 1, "decoder_attention_heads": 2, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128,
                 "num_mel_bins": 80, "max_source_positions": 50, "max_target_positions": 64,
                 "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 1,
                 "suppress_tokens": [], "begin_suppress_tokens": []}  # fmt: skip
_WAV2VEC2_TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 128,
                  "conv_dim": [32, 32, 32, 32, 32, 32, 32], "num_conv_pos_embeddings": 16,
                  "num_conv_pos_embedding_groups": 2}  # fmt: skip
# HuggingFaceTB/SmolLM2-135M's config, so that random weights (no hub) build the same architecture.
_SMOLLM2_135M = {"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
                 "intermediate_size": 1536, "vocab_size": 49152, "max_position_embeddings": 8192,
                 "tie_word_embeddings": True, "rms_norm_eps": 1e-5, "bos_token_id": 0, "eos_token_id": 0,
                 "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}}  # fmt: skip
_SMOLLM2_TINY = {**_SMOLLM2_135M, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                 "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 1000,
                 "max_position_embeddings": 128}  # fmt: skip
# Qwen2.5-0.5B's published config.json (biased q/k/v projections are Qwen2's own, not a config field)
_QWEN25_05B = {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
               "intermediate_size": 4864, "vocab_size": 151936, "max_position_embeddings": 32768,
               "tie_word_embeddings": True, "rms_norm_eps": 1e-6, "bos_token_id": 151643, "eos_token_id": 151643,
               "use_sliding_window": False,
               "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}}  # fmt: skip

BUILTIN_SPECS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="distilbert",
            model_type="distilbert",
            task="fill-mask",
            options=HuggingFaceOptions(model_id="distilbert-base-uncased", mask_token_id=103),
            output="mask",  # the course's program: the [MASK] position's logits, [1, 30522]
            description="DistilBERT base (uncased), masked-LM logits at the [MASK] position",
        ),
        ModelSpec(
            name="gpt2",
            model_type="gpt2",
            task="causal-lm",
            options=HuggingFaceOptions(model_id="openai-community/gpt2"),
            output="last",  # the course's program: the final position's logits, [1, 50257]
            description="GPT-2 small, next-token logits at the last position",
        ),
        ModelSpec(
            name="distilbert-tiny",
            model_type="distilbert",
            task="fill-mask",
            options=HuggingFaceOptions(config=_DISTILBERT_TINY, mask_token_id=103),
            description="2-layer, 64-dim DistilBERT with random weights, for tests and quick demos",
        ),
        ModelSpec(
            name="gpt2-tiny",
            model_type="gpt2",
            task="causal-lm",
            options=HuggingFaceOptions(config=_GPT2_TINY),
            description="2-layer, 64-dim GPT-2 with random weights, for tests and quick demos",
        ),
        ModelSpec(
            name="bert-base",
            model_type="bert",
            task="fill-mask",
            options=HuggingFaceOptions(model_id="bert-base-uncased", mask_token_id=103),
            description="BERT base (uncased), masked-LM logits at every position",
        ),
        ModelSpec(
            name="bert-base-tiny",
            model_type="bert",
            task="fill-mask",
            options=HuggingFaceOptions(config=_BERT_TINY, mask_token_id=103),
            description="2-layer, 64-dim BERT with random weights, for tests and quick demos",
        ),
        ModelSpec(
            name="vit",
            model_type="vit",
            task=IMAGE_TASK,
            options=HuggingFaceOptions(
                model_id="google/vit-base-patch16-224",
                config={"num_labels": 1000},  # ImageNet's classes, also for random weights (the default config has 2)
                image_size=224,
            ),
            description="ViT-B/16 (ImageNet, 1000 classes), 224x224 image",
        ),
        ModelSpec(
            name="vit-tiny",
            model_type="vit",
            task=IMAGE_TASK,
            options=HuggingFaceOptions(config=_VIT_TINY, image_size=32),
            description="2-layer, 64-dim ViT, 8x8 patches of a 32x32 image, 10 classes, random weights: for tests",
        ),
        ModelSpec(
            name="whisper-tiny-encoder",
            model_type="whisper",
            task="speech-encoder",
            options=HuggingFaceOptions(model_id="openai/whisper-tiny"),
            description="Whisper tiny's encoder: 30 s of log-mel features [1, 80, 3000] to hidden states",
        ),
        ModelSpec(
            name="whisper-tiny-encoder-tiny",
            model_type="whisper",
            task="speech-encoder",
            options=HuggingFaceOptions(config=_WHISPER_TINY),
            description="2-layer, 64-dim Whisper encoder on 1 s of log-mel features [1, 80, 100], random weights",
        ),
        ModelSpec(
            name="wav2vec2",
            model_type="wav2vec2",
            task="speech-encoder",
            options=HuggingFaceOptions(model_id="facebook/wav2vec2-base"),
            description="wav2vec 2.0 base: 1 s of 16 kHz audio [1, 16000] to hidden states",
        ),
        ModelSpec(
            name="wav2vec2-tiny",
            model_type="wav2vec2",
            task="speech-encoder",
            options=HuggingFaceOptions(config=_WAV2VEC2_TINY),
            description="2-layer, 64-dim wav2vec 2.0 on 1 s of 16 kHz audio, random weights: for tests",
        ),
        ModelSpec(
            name="smollm2-135m",
            model_type="llama",
            task="causal-lm",
            options=HuggingFaceOptions(model_id="HuggingFaceTB/SmolLM2-135M", config=_SMOLLM2_135M),
            description="SmolLM2-135M (Llama family, 30 layers, grouped-query attention), all positions' logits",
        ),
        ModelSpec(
            name="smollm2-tiny",
            model_type="llama",
            task="causal-lm",
            options=HuggingFaceOptions(config=_SMOLLM2_TINY),
            description="SmolLM2's architecture at 2 layers, 64 dims, random weights: for tests and quick demos",
        ),
        ModelSpec(
            name="smollm2-135m-gen",
            model_type="llama",
            task=GENERATION_TASK,
            output=GENERATION_OUTPUT,
            options=HuggingFaceOptions(model_id="HuggingFaceTB/SmolLM2-135M", config=_SMOLLM2_135M),
            seq_len=64,
            new_tokens=64,
            context=256,
            description="SmolLM2-135M generating: a 64-token prompt, then 64 tokens one at a time, KV cache of 256",
        ),
        ModelSpec(
            name="smollm2-gen-tiny",
            model_type="llama",
            task=GENERATION_TASK,
            output=GENERATION_OUTPUT,
            options=HuggingFaceOptions(
                config={**_SMOLLM2_TINY, "initializer_range": 0.2},  # as _GPT2_GEN_TINY: ids that vary
            ),
            seq_len=8,
            new_tokens=8,
            context=64,
            description="SmolLM2's architecture at 2 layers, generating 8 tokens after 8, random weights: for tests",
        ),
        ModelSpec(
            name="qwen2.5-0.5b-gen",
            model_type="qwen2",
            task=GENERATION_TASK,
            output=GENERATION_OUTPUT,
            options=HuggingFaceOptions(model_id="Qwen/Qwen2.5-0.5B", config=_QWEN25_05B),
            seq_len=64,
            new_tokens=64,
            context=256,
            description="Qwen2.5-0.5B generating (494M parameters, 24 layers, 14 query heads on 2 KV heads): "
            "a 64-token prompt, then 64 tokens, KV cache of 256",
        ),
        ModelSpec(
            name="gpt2-gen",
            model_type="gpt2",
            task=GENERATION_TASK,
            output=GENERATION_OUTPUT,
            options=HuggingFaceOptions(model_id="openai-community/gpt2"),
            seq_len=64,
            new_tokens=64,
            context=256,
            description="GPT-2 small generating: a 64-token prompt, then 64 tokens one at a time, KV cache of 256",
        ),
        ModelSpec(
            name="gpt2-gen-tiny",
            model_type="gpt2",
            task=GENERATION_TASK,
            output=GENERATION_OUTPUT,
            options=HuggingFaceOptions(config=_GPT2_GEN_TINY),
            seq_len=8,
            new_tokens=8,
            context=64,
            description="2-layer, 64-dim GPT-2 generating 8 tokens after 8, random weights: for tests",
        ),
        ModelSpec(
            name="mobilenet-v2",
            model_type="mobilenet_v2",
            task=IMAGE_TASK,
            options=TorchvisionOptions(image_size=224),
            model_source="torchvision",
            description="torchvision MobileNetV2 (ImageNet, 1000 classes), 224x224 image",
        ),
        ModelSpec(
            name="resnet-18",
            model_type="resnet18",
            task=IMAGE_TASK,
            options=TorchvisionOptions(image_size=224),
            model_source="torchvision",
            description="torchvision ResNet-18 (ImageNet, 1000 classes), 224x224 image",
        ),
        ModelSpec(
            name="mobilenet-v2-tiny",
            model_type="mobilenet_v2",
            task=IMAGE_TASK,
            options=TorchvisionOptions(kwargs=_MOBILENET_V2_TINY, image_size=32),
            model_source="torchvision",
            description="MobileNetV2 at width 0.25, 10 classes, 32x32 image, random weights: for tests and quick demos",
        ),
        ModelSpec(
            name="resnet-18-tiny",
            model_type="resnet18",
            task=IMAGE_TASK,
            options=TorchvisionOptions(kwargs=_RESNET_18_TINY, image_size=32),
            model_source="torchvision",
            description="ResNet-18 with 10 classes, 32x32 image, random weights: for tests and quick demos",
        ),
        ModelSpec(
            name="efficientnet-b0",
            model_type="efficientnet_b0",
            task=IMAGE_TASK,
            options=TimmOptions(image_size=224),
            model_source="timm",
            description="timm EfficientNet-B0 (ImageNet, 1000 classes), 224x224 image",
        ),
        ModelSpec(
            name="efficientnet-b0-tiny",
            model_type="test_efficientnet",
            task=IMAGE_TASK,
            options=TimmOptions(kwargs=_TEST_EFFICIENTNET_TINY, image_size=32),
            model_source="timm",
            description="timm's test_efficientnet (a 0.1M-parameter EfficientNet), 10 classes, 32x32 image, random "
            "weights: for tests and quick demos",
        ),
    )
}


# The inputs the built-ins that leave them to their family (the speech encoders) get from it, as the huggingface
# builder computes them from the config (HuggingFace.known_inputs): recorded here so that `fab models` imports no
# transformers; tests/commands/test_models_list.py checks them against the builder, so they cannot drift.
FAMILY_INPUTS: dict[str, tuple[InputSpec, ...]] = {
    "whisper-tiny-encoder": (InputSpec("input_features", "float32", (1, 80, 3000)),),
    "whisper-tiny-encoder-tiny": (InputSpec("input_features", "float32", (1, 80, 100)),),
    "wav2vec2": (InputSpec("input_values", "float32", (1, 16000)),),
    "wav2vec2-tiny": (InputSpec("input_values", "float32", (1, 16000)),),
}


def listed_inputs(spec: ModelSpec) -> tuple[InputSpec, ...]:
    """What a built-in takes, as `fab models` lists it: the spec's own inputs, else its family's (recorded)."""
    return spec.inputs or FAMILY_INPUTS.get(spec.name, ())


def resolve_spec(
    model: str | None = None,
    spec_path: str | Path | None = None,
    *,
    trust_remote_code: bool = False,
    trust_code: bool = False,
) -> ModelSpec:
    """The spec of a built-in model name or a spec file (exactly one); `trust_remote_code` and `trust_code` from the
    command line only."""
    if (model is None) == (spec_path is None):
        raise SpecError("give exactly one of a built-in model name or a spec file")
    if spec_path is not None:
        spec = load_spec_file(Path(spec_path))
    elif model in BUILTIN_SPECS:
        spec = BUILTIN_SPECS[model]
    else:
        spec = None
    if spec is not None:
        defaults = SOURCES[spec.model_source].defaults
        if defaults is not None:  # imports the source's library: only a spec that leaves a default to it
            import importlib  # only such specs need it

            module, _, name = defaults.partition(":")
            spec = getattr(importlib.import_module(module), name)(spec)
        return spec.allowed(trust_remote_code=trust_remote_code, trust_code=trust_code)
    assert model is not None  # a spec file is never unknown
    raise UnknownModel(
        f"unknown model {model!r}{did_you_mean(model, BUILTIN_SPECS)}; known models: {', '.join(BUILTIN_SPECS)}"
    )
