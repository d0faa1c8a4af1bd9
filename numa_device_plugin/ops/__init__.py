"""Operations: the HTTP probes (``probes``), logging (``logs``), file descriptor limits
(``limits``), the instance lock file (``instancelock``), heap trimming (``heap``),
early signals (``signals``) and the main loop's wake-ups (``wakeups``). Imports
nothing above it (only ``topology``).
"""
