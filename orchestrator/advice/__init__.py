"""The advisor: from where a run's time goes to what to change (findings, predicted savings), and the trial that
measures a proposed change on the board."""
