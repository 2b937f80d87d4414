"""The settings: ``BarrierConfig`` (``settings``) and where its values come from
(``environment``, the one reader of the environment)."""
