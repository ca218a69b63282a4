"""Which head a transformers family has for a spec's task (the `huggingface` source's build side): from transformers'
own task mappings (`modeling_auto.*_MAPPING_NAMES`, `TASK_HEADS`), and the head class's main input. A family and a
task that do not go together are refused before anything loads, naming the tasks the family has.
"""

from __future__ import annotations

from typing import Any

from orchestrator.config import did_you_mean
from orchestrator.lowering.spec import GENERATION_TASK, IMAGE_INPUT, TEXT_INPUTS, WRAPPED_TASKS, ModelSpec
from orchestrator.lowering.spec_errors import spec_failure

# task -> (the modeling_auto mapping of family -> head class, the Auto class that loads it)
TASK_HEADS: dict[str, tuple[str, str]] = {
    "fill-mask": ("MODEL_FOR_MASKED_LM_MAPPING_NAMES", "AutoModelForMaskedLM"),
    "causal-lm": ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "AutoModelForCausalLM"),
    GENERATION_TASK: ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "AutoModelForCausalLM"),
    "text-classification": ("MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES", "AutoModelForSequenceClassification"),
    "token-classification": ("MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES", "AutoModelForTokenClassification"),
    "feature-extraction": ("MODEL_MAPPING_NAMES", "AutoModel"),
    "image-classification": ("MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES", "AutoModelForImageClassification"),
    "audio-classification": ("MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES", "AutoModelForAudioClassification"),
    "speech-encoder": ("MODEL_MAPPING_NAMES", "AutoModel"),
}
AUTO_BUILT = (*WRAPPED_TASKS, GENERATION_TASK)  # built through their Auto class (whole model, head included)
TEXT_HEADS = ("text-classification", "token-classification", "feature-extraction")
# The main input of the head class -> the inputs etlab feeds it (the mask and types only where the family has them).
MAIN_INPUTS = {"input_ids": TEXT_INPUTS, IMAGE_INPUT: (IMAGE_INPUT,), "input_values": ("input_values",),
                "input_features": ("input_features",)}  # fmt: skip


def known_families() -> list[str]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    return list(CONFIG_MAPPING_NAMES)


def _mapped(mapping: str, model_type: str) -> str | None:
    from transformers.models.auto import modeling_auto

    name = getattr(modeling_auto, mapping).get(model_type)
    return name[0] if isinstance(name, tuple | list) else name


def _transformers_class(name: str) -> Any:
    """A class transformers exports, or None when its modelling code cannot be imported here."""
    import transformers

    try:
        return getattr(transformers, name)
    except (AttributeError, ImportError, RuntimeError):
        return None


def _default_config(model_type: str) -> Any:
    from transformers import CONFIG_MAPPING

    return CONFIG_MAPPING[model_type]()


def head_class(model_type: str, task: str) -> tuple[Any, bool] | None:
    """The class of the family's model for `task`, and whether the program is its encoder only (`get_encoder()`);
    None when the family has no such head, or none whose inputs etlab can make."""
    name = _mapped(TASK_HEADS[task][0], model_type)
    if name is None:
        return None
    encoder_only = False
    encoder_decoder = task in TEXT_HEADS and getattr(_default_config(model_type), "is_encoder_decoder", False)
    if encoder_decoder and task != "feature-extraction":
        return None  # a decoder to feed too (T5's classifiers want decoder ids and one <eos> per row): not etlab's
    if encoder_decoder:
        name = name.replace("Model", "EncoderModel", 1)  # T5EncoderModel: the encoder's last hidden state
    # wav2vec2 and its kind (CTC models) take input_values; Whisper's kind: the encoder, on log-mel input_features
    elif task == "speech-encoder" and _mapped("MODEL_FOR_CTC_MAPPING_NAMES", model_type) is None:
        if _mapped("MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES", model_type) is None:
            return None
        encoder_only = True
    found = _transformers_class(name)
    if found is None:
        return None
    main = main_input(found, encoder_only)
    if main == "input_features" and not _whisper_mel(_default_config(model_type)):
        return None  # log-mel features of another layout (frames first, stacked, ...): not ones etlab makes
    return (found, encoder_only) if main in MAIN_INPUTS else None


def _whisper_mel(config: Any) -> bool:
    """Whisper's kind: input_features are log-mel [batch, num_mel_bins, 2 x max_source_positions frames]."""
    return all(type(getattr(config, key, None)) is int for key in ("num_mel_bins", "max_source_positions"))


def spectrogram(config: Any) -> bool:
    """AST's kind: input_values are a log-mel filter bank [batch, max_length frames, num_mel_bins], not a waveform
    (the class declares both sizes)."""
    return {"max_length", "num_mel_bins"} <= set(getattr(type(config), "__dataclass_fields__", {}))


def main_input(cls: Any, encoder_only: bool) -> str:
    return "input_features" if encoder_only else str(getattr(cls, "main_input_name", "input_ids"))


def supported_tasks(model_type: str) -> list[str]:
    return [task for task in TASK_HEADS if head_class(model_type, task) is not None]


def check_family(spec: ModelSpec) -> tuple[Any, bool]:
    families = known_families()
    if spec.model_type not in families:
        same = [name for name in families if name.lower() == spec.model_type.lower()]
        close = f" (did you mean {same[0]!r}?)" if same else did_you_mean(spec.model_type, families)
        raise spec_failure([("model_type", f"{spec.model_type!r} is not a model family transformers knows{close}")],
                           spec)  # fmt: skip
    head = head_class(spec.model_type, spec.task)
    if head is None:
        able = supported_tasks(spec.model_type)
        tasks = f"supports {', '.join(able)}" if able else "has no head for any task etlab lowers"
        raise spec_failure([("task", f"{spec.task!r} does not go with model_type {spec.model_type!r}, which "
                                     f"{tasks}")], spec)  # fmt: skip
    return head
