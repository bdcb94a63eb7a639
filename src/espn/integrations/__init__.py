"""Bridges to other continual-learning frameworks; each imports its framework only when used
(``from espn.integrations.avalanche import ESPNStrategy`` needs ``pip install 'espn[avalanche]'``)."""
