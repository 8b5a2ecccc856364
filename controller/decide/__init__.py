"""What to try next: the Strategies (the rule policy and the Optuna search), the goodput model the rules predict
with, the calibration of those predictions against what trials measured, the k-by-batch schedule, and the expert
placement planner."""
