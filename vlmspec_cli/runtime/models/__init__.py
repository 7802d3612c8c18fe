"""Models: loading (hub id, folder or zoo: name), weight and config checks before transformers reads them, the hidden-state and EAGLE-3 heads, the captioner."""
