"""What the TensorFlow and Keras front ends share.

``publisher_hook`` and ``barrier_hooks`` (the session hooks), ``keras_barriers``
(the barrier callbacks), ``global_step`` (finding the global step),
``fetch_schedule`` (when the chief fetches it), ``wait_until_step`` (the
integer a target stands for), ``barrier_arrival``
and ``tf_logging``. Public through ``stepbarrier.tf_hooks`` and
``stepbarrier.keras_callbacks``.
"""
