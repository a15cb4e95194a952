"""Real answers: accuracy, calibration and exactness of the answers on real models and public
labelled data, and what each answer method costs in reads."""
