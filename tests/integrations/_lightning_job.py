"""A tiny Lightning job run by the tests: ``_lightning_job.py ROOT OUT_DIR PACKAGE
[--crash-at N] [--resume RUN_ID]``, PACKAGE ``lightning`` or ``pytorch_lightning``.

2 DDP processes on the CPU (Lightning's own launcher runs this script again as the second
process), 6 optimizer steps logged every step, validation every 3, then `test()`. A
CSVLogger beside ours records what Lightning handed the loggers, to compare with."""

from __future__ import annotations

import argparse
import importlib
from typing import Any

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("out_dir")
    parser.add_argument("package")
    parser.add_argument("--crash-at", type=int, default=0)
    parser.add_argument("--run-id")
    parser.add_argument("--resume", action="store_true")
    opts = parser.parse_args()
    pl: Any = importlib.import_module(
        "lightning.pytorch" if opts.package == "lightning" else "pytorch_lightning")
    from tracklake.integrations.lightning import TracklakeLogger

    crash_at = opts.crash_at

    class Tiny(pl.LightningModule):  # type: ignore[misc]
        def __init__(self, lr: float = 0.05, layers: dict[int, str] | None = None) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch: Any, index: int) -> Any:
            if crash_at and self.global_step == crash_at:
                raise RuntimeError(f"crash at step {crash_at}")
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch: Any, index: int) -> None:
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y), sync_dist=True)

        def test_step(self, batch: Any, index: int) -> None:
            x, y = batch
            self.log("test_loss", torch.nn.functional.mse_loss(self.net(x), y), sync_dist=True)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))

    def loader() -> Any:
        return torch.utils.data.DataLoader(data, batch_size=4)

    ours = TracklakeLogger(project="lt", name="tiny", root=opts.root, run_id=opts.run_id,
                           save_dir=opts.out_dir)
    csv = pl.loggers.CSVLogger(opts.out_dir, name="csv", version="v")
    pl.seed_everything(0)
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_steps=6, log_every_n_steps=1,
        val_check_interval=3, logger=[ours, csv], enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=opts.out_dir,
        callbacks=[pl.callbacks.ModelCheckpoint(every_n_train_steps=3, save_top_k=-1)])
    model = Tiny(layers={0: "in"})
    ckpt = None
    if opts.resume:
        ckpt = f"{opts.out_dir}/lt/{opts.run_id}/checkpoints/epoch=0-step=3.ckpt"
    trainer.fit(model, loader(), loader(), ckpt_path=ckpt)
    trainer.test(model, loader())


if __name__ == "__main__":
    main()
