"""Fleet management: desired state, reconciling, reported state, commands, the controller."""
