"""Code the three layers have in common: config, event validity, cell semantics and store helpers.

Nothing here imports a layer; every layer imports from here.
"""
