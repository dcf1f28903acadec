// placeholder: being written (issue 6)
