"""The base every room stands on: errors, logs, safe expressions, the figures a
trial's times turn into, the record types of a trial, and finding a user's
Python callables. Nothing here imports another room."""
