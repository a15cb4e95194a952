"""Statistics and calibration: content-free priors, calibration maps and their fitting, evaluation
metrics, losses, reliability, bootstrap intervals, gold labels.
"""
