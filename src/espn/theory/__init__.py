"""Theory lab: the paper's shallow-network model of continual representation learning as
CPU experiments, ``espn theory sample-complexity | mismatch | task-order | report``; its
modules are described in docs/theory.md."""
