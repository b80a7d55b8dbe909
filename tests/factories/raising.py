"""A factory with a bug of its own: the user's code raises while building the model."""

import torch


def layer(config):
    return torch.nn.Linear(config["width"], 4)  # no "width": KeyError in the user's own line


def make(**config):
    return layer({"depth": 2, **config})
