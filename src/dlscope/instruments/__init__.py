"""Instruments on the lab's own training, in dlscope's process (`dlscope lab`, `train`, `profile`,
`ops`, `graph`): the profiler's top-10, TensorBoard logs, the progress bar, the model summary, the
life-cycle graphs, each layer's memory, the environment table, TensorFlow's XPlane trace."""
