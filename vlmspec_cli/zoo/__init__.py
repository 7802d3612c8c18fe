"""tinyworld: the synthetic world, its tokenizer, training, and the shipped weights."""
