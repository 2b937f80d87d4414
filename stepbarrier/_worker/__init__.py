"""The worker's side: hold until the chief's step reaches a target."""
