"""Imported first by every job script: Python's cyclic garbage collector stays off until ``_job``
has imported TensorFlow and Keras, which then freezes what the imports made (``gc.freeze``) and
turns the collector back on.

Importing TensorFlow and Keras creates about 270,000 tracked objects and, with the collector on,
runs it some 600 times over them (0.44 of the import's 3.6 CPU-s here), and every full collection
during a job walks them all again. The test jobs start about 60 TensorFlow processes on 2 cores.
Frozen, the imports' objects are no longer walked; what the job itself creates is collected as
usual, with Python's default thresholds.
"""

import gc

gc.disable()
