"""The rows that counts decide, compared exactly on any clock: the counters of a step
(``counters``), of the input pipeline (``input_pipeline``), and the settings that change what a
step costs (``settings``)."""
