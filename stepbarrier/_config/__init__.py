"""The settings: ``BarrierConfig`` and where its values come from.

``settings`` (``BarrierConfig``), ``checks`` (what a value must satisfy),
``defaults``, ``environment`` (the one reader of ``STEPBARRIER_*`` and
``TF_CONFIG``), ``tf_config`` (the task ``TF_CONFIG`` gives this host) and
``schedule`` (the start ramps behind ``wait_until_step``).
"""
