"""A training script as a user writes it, with ortlab.record added: python train_with_record.py pt|ort OUT"""

import sys

import torch

import ortlab
from ortlab.demo import gpt

backend, out = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
w = gpt(n_layer=1, d_model=32, dropout=0.0)
model = w.model
if backend == "ort":
    from onnxruntime.training.ortmodule import ORTModule

    model = ORTModule(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

with ortlab.record(model, out=out, collect={"stats": {}}, batch_size=8) as rec:
    for step in range(3):
        x, y = w.batch(step)
        loss = w.loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        rec.step(loss=loss)
print(rec.path)
