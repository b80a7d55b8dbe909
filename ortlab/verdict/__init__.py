"""Do the two backends train the same model? The evidence (first-step gradients, ...) and the judgement."""
