"""Framework adapters, imported lazily: a torch-only box never imports TensorFlow."""
