"""Building the course: exercises from source/, notebook execution, slides, handout, nbgrader."""
