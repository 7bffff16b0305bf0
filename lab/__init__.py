"""Experiments that train small NumPy transformers at one length and test them at longer ones.

Run from a checkout with ``python -m lab`` (see ``lab/README.md``); not part of the minipos wheel.
``lab.model`` is the model and its optimiser, ``lab.tasks`` the tasks with a known optimum,
``lab.schemes`` the schemes under test, ``lab.run`` the protocol, ``lab.record`` the JSON records,
``lab.pool`` the runs side by side (one process per record), ``lab.corpus`` the text task's corpus,
``lab.summary`` the mean and spread over seeds, ``lab.bench`` the timing against torch.
"""
