"""Studies: several runs of espn put side by side (the paper's appendix experiment)."""

from espn.studies.pruners import StudyPoint, plot_pruner_study, run_pruner_study

__all__ = ["StudyPoint", "plot_pruner_study", "run_pruner_study"]
