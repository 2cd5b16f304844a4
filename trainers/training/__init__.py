"""Training: the pre-training `Trainer`, its run folder, resume records and lock, the recipe, the fast paths, and the
pre-training and fine-tuning runs built on them."""
