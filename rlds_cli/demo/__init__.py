"""The bundled demo dataset: a small D4RL-format file from a real (tiny) simulation."""
