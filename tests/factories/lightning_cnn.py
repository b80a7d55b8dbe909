"""LightningModules a factory returns with their data (ortlab.integrations.lightning): a small CNN with a per-step
scheduler, and ones ortlab refuses in one line."""

import lightning as L
import torch


class Classifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.fc = torch.nn.Linear(4 * 8 * 8, 10)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).flatten(1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return {"loss": loss}

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-2)
        scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, total_iters=5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class Images(L.LightningDataModule):
    def setup(self, stage):
        g = torch.Generator().manual_seed(0)
        self.data = torch.utils.data.TensorDataset(torch.randn(32, 1, 8, 8, generator=g),
                                                   torch.randint(0, 10, (32,), generator=g))

    def train_dataloader(self):
        return torch.utils.data.DataLoader(self.data, batch_size=8, shuffle=True)


def cnn():
    datamodule = Images()
    datamodule.setup("fit")
    return Classifier(), datamodule.train_dataloader()


def cnn_datamodule():
    return Classifier(), Images()


class NoLoss(Classifier):
    def training_step(self, batch, batch_idx):
        self(batch[0])


def no_loss():
    return NoLoss(), Images()


class Manual(Classifier):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False


def manual():
    return Manual(), Images()
