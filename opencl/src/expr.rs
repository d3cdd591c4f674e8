//! Length and work-size expressions: integer arithmetic over scalar arguments.
