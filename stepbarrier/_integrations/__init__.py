"""What the TensorFlow hooks and the Keras callbacks share, with no framework import;
public through ``stepbarrier.tf_hooks`` and ``stepbarrier.keras_callbacks``.
"""
