"""What a Trainer's run is configured with, as a nested mapping `log_config` takes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tracklake._write.coerce import jsonable


def trainer_config(args: Any, model: Any) -> dict[str, Any]:
    """The run's config: ``trainer/…`` (TrainingArguments, tokens already hidden by
    `to_dict()`), ``model/…`` (the model's config), ``peft/<adapter>/…`` and
    ``model/num_parameters``. Namespaced, where W&B's flat merge lets one overwrite the
    other."""
    # jsonable: every key as text (a model config's id2label has int keys, which
    # log_config refuses)
    config: dict[str, Any] = {"trainer": jsonable(args.to_dict())}
    model_config = getattr(model, "config", None)
    to_dict = getattr(model_config, "to_dict", None)
    if callable(to_dict):
        config["model"] = jsonable(to_dict())
    peft = getattr(model, "peft_config", None)
    if isinstance(peft, Mapping):
        config["peft"] = {str(name): jsonable(c.to_dict() if hasattr(c, "to_dict") else c)
                          for name, c in peft.items()}
    num_parameters = getattr(model, "num_parameters", None)
    if callable(num_parameters):
        config.setdefault("model", {})["num_parameters"] = int(num_parameters())
    return config
